"""Shared fixtures: a tiny fitted normalizer and fresh models (policy and registry tests)."""

from __future__ import annotations

import pytest
import torch

from dagsched.learner.curriculum import Curriculum
from dagsched.learner.train import demonstrations
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.sim.config import ScenarioConfig


@pytest.fixture(scope="session")
def normalizer() -> FeatureNormalizer:
    obs, _, _ = demonstrations(
        Curriculum(ScenarioConfig(), workflows_per_episode=6), 1, "heft", seed=0
    )
    return FeatureNormalizer().fit(obs)


@pytest.fixture
def model() -> ActorCritic:
    torch.manual_seed(0)
    return ActorCritic().eval()
