"""The observation reads history: what a family really used moves the predictions and the
base action; no history means the declared request."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.core.estimates import transfer_to_all_s, transfers_s
from dagsched.core.history import FamilySummary
from dagsched.core.observation import (
    CLUSTER_FEATURES,
    NODE_FEATURES,
    observe,
    transfer_estimate_s,
    transfer_estimates_s,
)
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.snapshot import cluster_view, task_view
from tests.sim.conftest import small_scenario

C = {name: i for i, name in enumerate(CLUSTER_FEATURES)}
N = {name: i for i, name in enumerate(NODE_FEATURES)}


def _first_task():
    sc = small_scenario(workflows=3)
    sim = Simulator(sc, generate_workflows(sc, 1), seed=1)
    batch = sim.advance()
    assert batch is not None
    return cluster_view(sim), task_view(batch[0], sim)


def test_without_history_the_prediction_is_the_declaration() -> None:
    cv, tv = _first_task()
    assert tv.history is None
    o = observe(cv, tv)
    spec = tv.workflow.tasks[tv.idx]
    assert o.cluster[C["hist_known"]] == 0.0
    assert o.cluster[C["pred_cpu_cores"]] == pytest.approx(spec.cpu_cores)
    assert o.cluster[C["pred_mem_gb"]] == pytest.approx(spec.mem_gb)
    np.testing.assert_array_equal(o.nodes[:, N["cpu_pred_frac"]], o.nodes[:, N["cpu_demand_frac"]])


def test_history_moves_the_prediction_and_the_anchor() -> None:
    cv, tv = _first_task()
    spec = tv.workflow.tasks[tv.idx]
    lean = FamilySummary(count=40, cpu_p50=0.3, cpu_p90=0.4, mem_p50=0.4, mem_p90=0.5,
                         runtime_ratio=2.0, runtime_p90=2.5, ooms=0, oom_limit=0.0)  # fmt: skip
    o = observe(cv, replace(tv, history=lean))
    base = observe(cv, tv)
    assert o.cluster[C["hist_known"]] == 1.0
    assert o.cluster[C["pred_mem_gb"]] == pytest.approx(0.5 * spec.mem_gb, rel=1e-5)
    assert o.cluster[C["pred_cpu_cores"]] == pytest.approx(0.4 * spec.cpu_cores, rel=1e-5)
    # the base action is heft_history's: the recommended request - the prediction with the
    # VPA margin - as fractions of each node, clamped to the bounds
    mem_frac = np.clip(0.5 * 1.15 * spec.mem_gb / cv.mem_gb, *MEM_BOUNDS)
    np.testing.assert_allclose(o.base[:, 1], mem_frac, rtol=1e-5)
    cpu_frac = np.clip(0.4 * 1.15 * spec.cpu_cores / cv.cores, *CPU_BOUNDS)
    np.testing.assert_allclose(o.base[:, 0], cpu_frac, rtol=1e-5)
    # a family that runs twice as long as declared finishes later everywhere
    assert (o.nodes[:, N["log_pred_finish_s"]] > base.nodes[:, N["log_pred_finish_s"]]).all()
    # after an OOM kill at 0.9 of its request, memory is predicted at >= 1.2 x that
    burned = replace(lean, ooms=1, oom_limit=0.9)
    o = observe(cv, replace(tv, history=burned))
    assert o.cluster[C["pred_mem_gb"]] == pytest.approx(1.08 * spec.mem_gb, rel=1e-5)
    # and the base's memory is the bumped limit, which beats p90 x 1.15 here
    mem_frac = np.clip(1.08 * spec.mem_gb / cv.mem_gb, *MEM_BOUNDS)
    np.testing.assert_allclose(o.base[:, 1], mem_frac, rtol=1e-5)


def test_measured_node_use_is_next_to_the_reservation() -> None:
    sc = small_scenario(workflows=6, node_failure_per_hour=0, transient=0)
    sim = Simulator(sc, generate_workflows(sc, 2), seed=2)
    from dagsched.sim.runner import make_policy

    policy = make_policy("heft", 2)
    for _ in range(3):
        batch = sim.advance()
        assert batch is not None
        sim.apply(policy.decide(sim, batch), batch)
    batch = sim.advance()
    assert batch is not None
    o = observe(cluster_view(sim), task_view(batch[0], sim))
    reserved, used = o.nodes[:, N["cpu_used"]], o.nodes[:, N["cpu_really_used"]]
    assert (used <= reserved + 1e-6).all() and used.sum() > 0
    assert (used < reserved - 1e-6).any()  # tasks use less than they reserve


def test_only_nodes_that_can_hold_the_recommended_memory_may_be_chosen() -> None:
    """The mask: alive nodes whose largest memory reservation holds what history recommends;
    every alive node when none can (heft_history's candidates)."""
    cv, tv = _first_task()
    spec = tv.workflow.tasks[tv.idx]
    cap = cv.mem_gb * MEM_BOUNDS[1]  # the most each node can reserve
    assert len(set(cap.tolist())) > 1  # nodes of several memory sizes
    # a family whose peaks run at a ratio that only the larger nodes can hold
    ratio = float(np.median(cap)) / spec.mem_gb / 1.15 * 1.01
    big = FamilySummary(count=40, cpu_p50=1.0, cpu_p90=1.0, mem_p50=ratio, mem_p90=ratio,
                        runtime_ratio=1.0, runtime_p90=1.0, ooms=0, oom_limit=0.0)  # fmt: skip
    o = observe(cv, replace(tv, history=big))
    want = cap >= ratio * 1.15 * spec.mem_gb
    assert 0 < want.sum() < cv.n
    np.testing.assert_array_equal(o.mask, want & cv.alive.astype(bool))
    # a family no node can hold: every alive node stays a candidate
    huge = replace(big, mem_p50=1e3, mem_p90=1e3)
    np.testing.assert_array_equal(
        observe(cv, replace(tv, history=huge)).mask, cv.alive.astype(bool)
    )
    # without history the declared request: every node holds the small test tasks
    assert observe(cv, tv).mask.all()


def test_transfers_are_bounded_by_the_nics_in_a_zone_and_the_backbone_across() -> None:
    zone = np.array([0, 0, 1])
    gbps = np.array([10.0, 1.0, 10.0])
    t = transfers_s(zone, gbps, np.array([0, 2]), np.array([1e9, 5e8]))
    # from node 0: itself 0; node 1 in its zone at its 1 Gb/s NIC; node 2 across at 5 Gb/s
    np.testing.assert_allclose(t[0], [0.0, 8.0 + 0.001, 1.6 + 0.05])
    # from node 2, across: the backbone's 5 Gb/s, or the receiver's NIC where slower
    np.testing.assert_allclose(t[1], [0.8 + 0.05, 4.0 + 0.05, 0.0])
    np.testing.assert_array_equal(transfer_to_all_s(zone, gbps, 2, 5e8), t[1])


def test_a_batch_of_transfer_estimates_is_each_tasks_slowest_parent() -> None:
    sc = small_scenario(workflows=20)
    sim = Simulator(sc, generate_workflows(sc, 3), seed=3)
    policy = make_policy("least_loaded", 0)
    tasks = []
    while len(tasks) < 40 and (b := sim.advance()) is not None:
        tasks += [task_view(t, sim) for t in b]
        sim.apply(policy.decide(sim, b), b)
    cv = cluster_view(sim)
    with_parents = [t for t in tasks if any(n >= 0 for n in t.parent_nodes)]
    assert len(with_parents) >= 10 and any(len(t.parent_nodes) >= 2 for t in with_parents)
    got = transfer_estimates_s(cv, tasks)
    for i, t in enumerate(tasks):
        want = np.zeros(cv.n)
        for p, node in zip(t.workflow.parents[t.idx], t.parent_nodes, strict=True):
            if node >= 0:
                nbytes = t.workflow.tasks[p].output_bytes
                want = np.maximum(want, transfer_to_all_s(cv.zone, cv.net_gbps, node, nbytes))
        np.testing.assert_array_equal(got[i], want)
        np.testing.assert_array_equal(transfer_estimate_s(cv, t), want)
