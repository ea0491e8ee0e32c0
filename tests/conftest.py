"""Shared fixtures: a tiny fitted normalizer, fresh models, and one Redis for the session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from dagsched.daemon.redis_binary import find_redis_server
from dagsched.daemon.redis_server import DEFAULT_REDIS, RedisServer
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


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A private redis-server when one is installed (`make setup` installs it, with apt or
    from PyPI), else the local default. Tests prefix their keys and channels, so sharing it is
    safe."""
    if find_redis_server() is None:
        yield DEFAULT_REDIS
        return
    server = RedisServer().start()
    try:
        yield server.url
    finally:
        server.stop()
