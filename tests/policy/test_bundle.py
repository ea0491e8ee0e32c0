"""Bundles: round trip, tamper refusal, incompatible features refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dagsched.policy.bundle import (
    BundleError,
    load_bundle,
    save_bundle,
    smoke_views,
    verify_checksums,
)
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler
from dagsched.sim.runner import simulate
from dagsched.sim.snapshot import SchedulerPolicy
from tests.sim.conftest import small_scenario


def test_round_trip_gives_identical_decisions(
    tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    save_bundle(tmp_path, model, normalizer)
    loaded = load_bundle(tmp_path, "v1")
    sc = small_scenario(workflows=3)
    a = simulate(sc, SchedulerPolicy(GNNScheduler(model, normalizer, "x")), seed=4)
    b = simulate(sc, SchedulerPolicy(loaded), seed=4)
    assert a["decisions"] == b["decisions"] and a["mean_jct_s"] == b["mean_jct_s"]


def test_tampered_weights_are_refused(
    tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    sums = save_bundle(tmp_path, model, normalizer)
    with (tmp_path / "state_dict.pt").open("ab") as f:
        f.write(b"\0")
    with pytest.raises(BundleError, match=r"checksum mismatch for state_dict\.pt"):
        load_bundle(tmp_path, "v1", expected=sums)


def test_other_features_are_refused(
    tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    save_bundle(tmp_path, model, normalizer)
    schema = json.loads((tmp_path / "feature_schema.json").read_text())
    schema["nodes"] = schema["nodes"][:-1]
    (tmp_path / "feature_schema.json").write_text(json.dumps(schema))
    sums = json.loads((tmp_path / "checksums.json").read_text())
    from dagsched.policy.bundle import sha256

    sums["feature_schema.json"] = sha256(tmp_path / "feature_schema.json")
    with pytest.raises(BundleError, match="other features"):
        load_bundle(tmp_path, "v1", expected=sums)


def test_shipped_champion_loads_its_own_trained_weights() -> None:
    shipped = Path(__file__).resolve().parents[2] / "models" / "champion"
    assert verify_checksums(shipped) == json.loads((shipped / "checksums.json").read_text())
    sched = load_bundle(shipped, "shipped")
    stored = torch.load(shipped / "state_dict.pt", map_location="cpu", weights_only=True)
    loaded = sched.model.state_dict()
    assert loaded.keys() == stored.keys()
    assert all(torch.equal(loaded[k], stored[k]) for k in stored)
    norm = FeatureNormalizer.load(shipped / "normalizer.joblib")
    for group in ("nodes", "cluster", "dag"):
        for got, want in zip(sched.normalizer.stats(group), norm.stats(group), strict=True):
            np.testing.assert_array_equal(got, want)


def test_loading_readies_the_served_path(tmp_path: Path) -> None:
    """The smoke inference goes through `place` too: the numpy mirror is built (and numba's
    loops compiled or loaded) before the first real batch, and its placements are checked."""
    shipped = Path(__file__).resolve().parents[2] / "models" / "champion"
    sched = load_bundle(shipped, "shipped")
    assert sched._net is not None
    assert len(sched.last_observations) == len(smoke_views()[1])
    assert load_bundle(shipped, "lazy", smoke=False)._net is None


def test_smoke_inference_refuses_nan_weights(
    tmp_path: Path, model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    import torch

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    save_bundle(tmp_path, model, normalizer)
    with pytest.raises(BundleError, match="smoke inference"):
        load_bundle(tmp_path, "v1")


def test_shipped_champion_beats_declared_heft_at_load_095() -> None:
    """One held-out seed of the default scenario at load 0.95: the champion reads history,
    declared HEFT cannot, and loses workflows to repeated OOM kills."""
    from dataclasses import replace as _replace

    from dagsched.sim.config import ScenarioConfig

    sched = load_bundle(Path(__file__).resolve().parents[2] / "models" / "champion", "shipped")
    sc = ScenarioConfig()
    sc = _replace(sc, workload=_replace(sc.workload, load=0.95, workflows=60))
    champ = simulate(sc, SchedulerPolicy(sched, "champion"), seed=10_000)
    heft = simulate(sc, "heft", seed=10_000)
    assert champ["sla_attainment"] > heft["sla_attainment"]
    assert champ["oom_kills"] < heft["oom_kills"]
