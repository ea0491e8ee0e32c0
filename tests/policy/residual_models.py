"""Models for the served path's tests: an untrained residual model is heft_history exactly, so
tests of the network's arithmetic give its residual layers random weights."""

from __future__ import annotations

import torch
from torch import nn

from dagsched.policy.model import ActorCritic, ModelConfig


def with_random_residual(model: ActorCritic, seed: int, scale: float = 1.0) -> ActorCritic:
    """`model` with the last layers of its node scorer and continuous head (zero at
    initialisation) drawn at random, `scale` x a default layer's spread; in eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for head in (model.scorer, model.cont_head):
            last = head[-1]
            assert isinstance(last, nn.Linear)
            bound = scale / last.in_features**0.5
            last.weight.copy_((torch.rand(last.weight.shape, generator=g) * 2 - 1) * bound)
            last.bias.copy_((torch.rand(last.bias.shape, generator=g) * 2 - 1) * bound)
    return model.eval()


def random_model(
    seed: int, scale: float = 1.0, cls: type[ActorCritic] = ActorCritic
) -> ActorCritic:
    """A freshly initialised model (torch seed `seed`) with a random residual."""
    torch.manual_seed(seed)
    return with_random_residual(cls(ModelConfig()), seed, scale)
