"""Drift: some nodes slow down and fail more from a point in simulated time, unannounced."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.observation import NODE_FEATURES, observe
from dagsched.sim.config import DriftConfig, FaultConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.snapshot import cluster_view, task_view
from tests.sim.conftest import small_scenario


def test_drift_picks_a_share_of_every_kind() -> None:
    nodes = DriftConfig(at_s=0).nodes(32)
    assert len(nodes) == 8
    assert sorted({n // 8 for n in nodes}) == [0, 1, 2, 3]  # groups are 8 nodes of one kind
    with pytest.raises(ValueError, match="slowdown"):
        DriftConfig(at_s=0, slowdown=0.5)


def _slowdown_by_node(drift: DriftConfig | None) -> tuple[Simulator, dict[int, set[float]]]:
    """Per node, the ratios of actual compute time to what its advertised speed implies."""
    sc = replace(small_scenario(workflows=40, exact=True), drift=drift)
    wfs = {wf.id: wf for wf in generate_workflows(sc, 2)}
    sim = Simulator(sc, list(wfs.values()), seed=2, keep_log=True)
    sim.run(make_policy("round_robin", 2))
    assert sim.log is not None
    ratios: dict[int, set[float]] = {}
    for r in sim.log:
        if r.outcome == "done":
            spec, node = wfs[r.wf_id].tasks[r.idx], r.node
            advertised = spec.duration_s / sim.cluster.speed[node, spec.type]
            advertised *= max(1.0, spec.cpu_cores / r.res_cores)
            ratios.setdefault(node, set()).add(round(r.runtime_s / advertised, 6))
    return sim, ratios


def test_drifted_nodes_run_slower_but_advertise_the_same_speed() -> None:
    sim, ratios = _slowdown_by_node(DriftConfig(at_s=0.0, slowdown=3.0, failure_mult=1.0))
    hit = set(DriftConfig(at_s=0).nodes(sim.cluster.n))
    assert sim.drifted_at == 0.0
    assert hit & set(ratios) and set(ratios) - hit
    for node, r in ratios.items():
        assert r == ({3.0} if node in hit else {1.0}), node
    assert (sim.cluster.speed == Simulator(sim.scenario, []).cluster.speed).all()
    _, before = _slowdown_by_node(None)
    assert all(r == {1.0} for r in before.values())


def test_drift_multiplies_the_node_failure_rate() -> None:
    sc = replace(
        small_scenario(workflows=400, load=0.8),
        faults=FaultConfig(node_failure_per_hour=0.5, repair_mean_s=60, transient_task_failure=0),
    )
    counts = []
    for drift in (None, DriftConfig(at_s=0.0, node_share=1.0, slowdown=1.0, failure_mult=5.0)):
        sim = Simulator(replace(sc, drift=drift), generate_workflows(sc, 5), seed=5)
        out = sim.run(make_policy("least_loaded", 5))
        counts.append(out["node_failures"] / sim.summary()["node_hours"])
    assert 3.0 < counts[1] / counts[0] < 8.0, counts


def test_the_measured_slowdown_follows_what_finished_tasks_show() -> None:
    sim, ratios = _slowdown_by_node(DriftConfig(at_s=0.0, slowdown=3.0, failure_mult=1.0))
    hit = set(DriftConfig(at_s=0).nodes(sim.cluster.n))
    measured = sim.cluster.observed_slowdown
    for node in ratios:  # every node that finished something
        if node in hit:
            assert 1.5 < measured[node] <= 3.0 + 1e-9, node
        else:
            assert abs(measured[node] - 1.0) < 1e-9, node
    view_slowdown = cluster_view(sim).slowdown
    assert view_slowdown.tolist() == measured
    # what a policy sees: the estimated run time on a node scales with its measured slowdown
    quiet, _ = _slowdown_by_node(None)
    assert all(abs(s - 1.0) < 1e-9 for s in quiet.cluster.observed_slowdown)


def test_a_measured_slowdown_lengthens_the_estimates_in_the_observation() -> None:
    sc = small_scenario(workflows=3)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    batch = sim.advance()
    assert batch is not None
    cv, tv = cluster_view(sim), task_view(batch[0])
    slowed = replace(cv, slowdown=np.where(np.arange(cv.n) == 2, 3.0, 1.0))
    a, b = observe(cv, tv).nodes, observe(slowed, tv).nodes
    for name in ("log_compute_s", "log_finish_s"):
        col = NODE_FEATURES.index(name)
        assert b[2, col] > a[2, col]
        assert np.array_equal(np.delete(b[:, col], 2), np.delete(a[:, col], 2))
    speed = NODE_FEATURES.index("speed")  # the advertised speed is what it was
    assert np.array_equal(a[:, speed], b[:, speed])
