"""The maths of PPO as pure functions: GAE and the clipped loss (CleanRL's names)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


def compute_gae(
    rewards: np.ndarray,
    values: np.ndarray,
    dones: np.ndarray,
    last_value: float,
    gamma: float,
    gae_lambda: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimates and returns for one trajectory segment.

    `dones[t]` is 1 when step t ended its episode (no bootstrap from t + 1).
    """
    n = len(rewards)
    advantages = np.zeros(n, dtype=np.float64)
    lastgaelam = 0.0
    for t in reversed(range(n)):
        next_value = last_value if t == n - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_value * nonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


@dataclass
class LossParts:
    """The PPO loss and its diagnostics (logged as `losses/...`)."""

    loss: Tensor
    pg_loss: Tensor
    v_loss: Tensor
    entropy: Tensor
    approx_kl: Tensor
    clipfrac: Tensor


def ppo_loss(
    newlogprob: Tensor,
    oldlogprob: Tensor,
    advantages: Tensor,
    newvalue: Tensor | None,
    returns: Tensor | None,
    entropy: Tensor,
    clip_coef: float,
    ent_coef: float,
    vf_coef: float,
    normalize_advantages: bool = True,
) -> LossParts:
    """Clipped surrogate + value + entropy loss. `newvalue=None` drops the value term
    (online fine-tuning of the actor heads only)."""
    logratio = newlogprob - oldlogprob
    ratio = logratio.exp()
    with torch.no_grad():
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip_coef).float().mean()
    mb_adv = advantages
    if normalize_advantages and mb_adv.numel() > 1:
        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
    pg_loss1 = -mb_adv * ratio
    pg_loss2 = -mb_adv * torch.clamp(ratio, 1 - clip_coef, 1 + clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()
    if newvalue is not None and returns is not None:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()
    else:
        v_loss = torch.zeros(())
    ent = entropy.mean()
    loss = pg_loss - ent_coef * ent + vf_coef * v_loss
    return LossParts(loss, pg_loss, v_loss, ent, approx_kl, clipfrac)
