"""The registry on a real MLflow SQLite store: register, alias, verify, refuse, ship."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagsched.policy.bundle import save_bundle
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.registry.errors import RegistryError
from dagsched.registry.serving import load_alias
from dagsched.registry.store import CHAMPION, Registry
from dagsched.registry.uri import load_model
from dagsched.settings import load_settings
from tests.conftest import clone_mlflow_home


@pytest.fixture
def registry(tmp_path: Path, mlflow_template: Path) -> Registry:
    """An empty registry in its own SQLite store (a copy of one created once per session)."""
    home = clone_mlflow_home(mlflow_template, tmp_path / "home")
    return Registry(load_settings(overrides={"home": home}, environ={}))


def _register(
    reg: Registry,
    folder: Path,
    model: ActorCritic,
    norm: FeatureNormalizer,
    parent: str | None = None,
) -> str:
    save_bundle(folder, model, norm)
    with reg.run("test", {"k": 1}) as run:
        run.log_metrics({"charts/x": 1.0}, 1)
        return reg.register_bundle(
            folder, run.run_id, metrics={"eval/model_sla": 0.9}, parent=parent, data="unit test"
        )


def test_first_version_is_champion_and_loads_verified(
    registry: Registry, tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    v1 = _register(registry, tmp_path / "b1", model, normalizer)
    v2 = _register(registry, tmp_path / "b2", model, normalizer, parent=v1)
    assert registry.alias_version(CHAMPION) == v1
    assert [str(v.version) for v in registry.versions()] == [v2, v1]
    tags = registry.client.get_model_version(registry.name, v2).tags
    assert tags["parent"] == v1 and tags["data"] == "unit test"
    assert tags["metric.eval/model_sla"] == "0.9"
    assert len(tags["sha256.state_dict.pt"]) == 64
    sched = registry.load(v1)
    assert sched.version == f"v{v1}"
    loaded = load_alias(registry.settings, CHAMPION)
    assert loaded is not None and loaded[0] == f"v{v1}"


def test_tampered_artifact_is_refused(
    registry: Registry, tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    v = _register(registry, tmp_path / "b", model, normalizer)
    folder = registry.bundle_folder(v)
    with (folder / "normalizer.joblib").open("ab") as f:
        f.write(b"tampered")
    with pytest.raises(RegistryError, match=r"refused.*normalizer\.joblib"):
        registry.load(v)


def test_empty_registry_registers_the_shipped_champion(registry: Registry) -> None:
    assert registry.versions() == []
    name, sched = load_model(registry, None)
    assert name == CHAMPION
    assert registry.alias_version(CHAMPION) == "1"
    tags = registry.client.get_model_version(registry.name, "1").tags
    assert tags["origin"] == "shipped"
    assert sched.version == "v1"


def test_unknown_model_uri_is_a_clear_error(registry: Registry) -> None:
    with pytest.raises(RegistryError, match="cannot resolve"):
        load_model(registry, "no-such-thing")


def test_serving_names_versions_as_decisions_do(
    registry: Registry, tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    """alias_version and load_alias agree, so the daemon's poll sees 'no change' and does not
    reload the same version over and over."""
    from dagsched.registry.serving import alias_version

    v = _register(registry, tmp_path / "b", model, normalizer)
    loaded = load_alias(registry.settings, CHAMPION)
    assert loaded is not None
    assert alias_version(registry.settings, CHAMPION) == loaded[0] == f"v{v}"
    assert alias_version(registry.settings, "challenger") is None
