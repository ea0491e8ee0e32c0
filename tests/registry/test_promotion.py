"""Promotion and rollback on a real MLflow SQLite store, with the notice on a private Redis."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import redis
import torch

from dagsched.policy.bundle import save_bundle
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.registry.errors import RegistryError
from dagsched.registry.promotion import Promoter, audit_trail
from dagsched.registry.serving import model_channel
from dagsched.registry.store import CHALLENGER, CHAMPION, HOLDBACK, PREVIOUS, SHADOW, Registry
from dagsched.settings import load_settings
from tests.conftest import clone_mlflow_home


@pytest.fixture
def registry(tmp_path: Path, redis_url: str, mlflow_template: Path) -> Registry:
    """An empty registry in its own SQLite store (a copy of one created once per session)."""
    home = clone_mlflow_home(mlflow_template, tmp_path / "home")
    s = load_settings(overrides={"home": home, "redis_url": redis_url}, environ={})
    return Registry(s)


def _register(reg: Registry, folder: Path, seed: int, norm: FeatureNormalizer) -> str:
    torch.manual_seed(seed)
    save_bundle(folder, ActorCritic().eval(), norm)
    with reg.run("test", {}) as run:
        return reg.register_bundle(folder, run.run_id, metrics={}, parent=None, data="t")


def test_promote_moves_aliases_audits_and_notifies(
    registry: Registry, tmp_path: Path, normalizer: FeatureNormalizer
) -> None:
    v1 = _register(registry, tmp_path / "b1", 1, normalizer)
    v2 = _register(registry, tmp_path / "b2", 2, normalizer)
    registry.set_alias(CHALLENGER, v2)
    sub = redis.Redis.from_url(registry.settings.redis_url).pubsub()
    sub.subscribe(model_channel(registry.settings))
    assert sub.get_message(timeout=2)["type"] == "subscribe"

    rec = Promoter(registry).promote(v2, "A/B says better", "tester", {"sla": {"diff": 0.1}})
    assert registry.aliases() == {CHAMPION: v2, PREVIOUS: v1}  # challenger alias consumed
    msg = sub.get_message(timeout=5)
    assert msg is not None and json.loads(msg["data"]) == {
        "action": "promote",
        "version": v2,
        "from": v1,
    }
    trail = audit_trail(registry)
    assert [(r["action"], r["version"], r["from_version"]) for r in trail] == [("promote", v2, v1)]
    assert trail[0]["actor"] == "tester" and trail[0]["reason"] == "A/B says better"
    assert rec["stats"] == {"sla": {"diff": 0.1}}
    tags = registry.client.get_model_version(registry.name, v2).tags
    assert json.loads(tags["audit.promote"])["actor"] == "tester"

    Promoter(registry).rollback("SLA dropped", "guardrail")
    assert registry.alias_version(CHAMPION) == v1
    assert registry.alias_version(PREVIOUS) is None
    assert registry.client.get_model_version(registry.name, v2).tags["rolled_back"] == "true"
    msg = sub.get_message(timeout=5)
    assert msg is not None and json.loads(msg["data"])["action"] == "rollback"
    assert [r["action"] for r in audit_trail(registry)] == ["promote", "rollback"]
    assert [r["action"] for r in audit_trail(registry, v2)] == ["promote", "rollback"]
    with pytest.raises(RegistryError, match="no previous"):
        Promoter(registry).rollback("again", "tester")
    sub.close()


def test_a_holdback_serves_the_old_champion_until_cleared_or_rolled_back(
    registry: Registry, tmp_path: Path, normalizer: FeatureNormalizer
) -> None:
    notices: list[str] = []
    promoter = Promoter(registry, notify=notices.append)
    v1 = _register(registry, tmp_path / "b1", 1, normalizer)
    v2 = _register(registry, tmp_path / "b2", 2, normalizer)
    v3 = _register(registry, tmp_path / "b3", 3, normalizer)
    promoter.promote(v2, "replay win", "evaluator", holdback=True)
    assert registry.aliases() == {CHAMPION: v2, PREVIOUS: v1, HOLDBACK: v1}
    promoter.clear(v2, "guardrail: no worse", "evaluator", {"sla": {"diff": 0.0}})
    assert registry.aliases() == {CHAMPION: v2, PREVIOUS: v1}
    assert json.loads(notices[-1]) == {"action": "clear", "version": v2, "from": v1}

    promoter.promote(v3, "replay win", "evaluator", holdback=True)
    assert registry.alias_version(HOLDBACK) == v2
    promoter.rollback("guardrail: worse than its holdback slice", "evaluator")
    assert registry.aliases() == {CHAMPION: v2}
    promoter.promote(v3, "by hand", "operator")  # no holdback asked: none kept
    assert registry.aliases() == {CHAMPION: v3, PREVIOUS: v2}
    trail = [(r["action"], r["version"], r["from_version"]) for r in audit_trail(registry)]
    assert trail == [
        ("promote", v2, v1), ("clear", v2, v1), ("promote", v3, v2), ("rollback", v2, v3),
        ("promote", v3, v2),
    ]  # fmt: skip


def test_tampered_version_is_refused_and_the_champion_keeps_serving(
    registry: Registry, tmp_path: Path, normalizer: FeatureNormalizer
) -> None:
    notices: list[str] = []
    v1 = _register(registry, tmp_path / "b1", 1, normalizer)
    v2 = _register(registry, tmp_path / "b2", 2, normalizer)
    with (registry.bundle_folder(v2) / "state_dict.pt").open("ab") as f:
        f.write(b"tampered")
    started = time.time()
    with pytest.raises(RegistryError, match="refused"):
        Promoter(registry, notify=notices.append).promote(v2, "try", "tester")
    assert registry.aliases() == {CHAMPION: v1}
    assert notices == [] and audit_trail(registry) == []
    assert registry.load(v1).version == f"v{v1}"
    assert time.time() - started < 30


def test_a_shadow_of_another_lineage_is_dropped_not_tested(
    registry: Registry, tmp_path: Path, normalizer: FeatureNormalizer
) -> None:
    """After a test ends, only a shadow fine-tuned from the champion the test ran under is
    tested next (the learner's alias flow, `learner.keep_learning`); one made under an older
    champion, say before a rollback, loses its alias and no challenger is proposed."""
    v1 = _register(registry, tmp_path / "b1", 1, normalizer)
    torch.manual_seed(3)
    save_bundle(tmp_path / "b3", ActorCritic().eval(), normalizer)
    with registry.run("test", {}) as run:
        stale = registry.register_bundle(
            tmp_path / "b3", run.run_id, metrics={}, parent="999", data="t"
        )
    registry.set_alias(SHADOW, stale)
    notices: list[str] = []
    assert Promoter(registry, notices.append).shadow_to_challenger(v1, "tester") is None
    assert registry.aliases() == {CHAMPION: v1}
    assert notices == [] and audit_trail(registry) == []
    # and one of the lineage is: a challenger move, audited and announced
    with registry.run("test", {}) as run:
        ok = registry.register_bundle(tmp_path / "b3", run.run_id, metrics={}, parent=v1, data="t")
    registry.set_alias(SHADOW, ok)
    assert Promoter(registry, notices.append).shadow_to_challenger(v1, "tester") == ok
    assert registry.aliases() == {CHAMPION: v1, CHALLENGER: ok}
    assert [json.loads(n)["action"] for n in notices] == ["challenger"]
    assert [r["action"] for r in audit_trail(registry)] == ["challenger"]
