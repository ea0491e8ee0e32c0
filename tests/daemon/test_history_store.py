"""The daemon's history in Redis holds the simulator's numbers for the same events, learnt
from what each task declared as kept with its reservation (no workflow is stored)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.history import summarize
from dagsched.core.observation import observe
from dagsched.core.workflow import TASK_TYPE_NAMES, Workflow
from dagsched.daemon.history_store import Declared
from dagsched.daemon.redis_state import RedisState, Reservation
from dagsched.schemas.messages import NodeHeartbeatMsg, TaskFailedMsg, TaskFinishedMsg
from dagsched.settings import Settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import AttemptRecord, Simulator
from dagsched.sim.executor import end_message
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.snapshot import cluster_view, task_view


def _small(settings: Settings, workflows: int, size: tuple[int, int]) -> ScenarioConfig:
    """The test profile's scenario on 8 nodes with a short workload."""
    wl = replace(settings.sim.workload, workflows=workflows, size=size)
    return replace(settings.sim, cluster=settings.sim.cluster.scaled(8), workload=wl)


def _event(r: AttemptRecord, node: str) -> TaskFinishedMsg | TaskFailedMsg:
    return end_message(r, node)


async def _reserve(
    rstate: RedisState, records: list[AttemptRecord], wfs: dict[str, Workflow], ids: list[str]
) -> None:
    """Each attempt's decision and reservation, as the daemon stores them: with what its task
    declared (queued when its node is full)."""
    items = []
    for r in records:
        spec = wfs[r.wf_id].tasks[r.idx]
        declared = Declared(spec.family, TASK_TYPE_NAMES[spec.type], spec.cpu_cores,
                            spec.mem_gb, spec.duration_s)  # fmt: skip
        res = Reservation(f"{r.wf_id}/{r.idx}", r.attempt, ids[r.node], 1.0, 1.0, 1.0, b"{}",
                          fits=True, declared=declared)  # fmt: skip
        items.append((res, "queue"))
    statuses = await rstate.decide_many(items)
    assert {s for s, _ in statuses} <= {"r", "q"}


async def _heartbeats(rstate: RedisState, sim: Simulator) -> list[str]:
    """Every node of `sim` announced to the daemon's state; returns their ids."""
    ids = [f"node-{i:04d}" for i in range(sim.cluster.n)]
    for i, info in enumerate(sim.cluster.nodes):
        hb = NodeHeartbeatMsg(node=ids[i], at=0.0, kind=info.kind, zone=info.zone,  # type: ignore[arg-type]
                              cores=info.cores, mem_gb=info.mem_gb)  # fmt: skip
        await rstate.apply_event(hb)
    return ids


async def test_redis_history_equals_the_simulators_for_the_same_events(
    rstate: RedisState, settings: Settings
) -> None:
    sc = _small(settings, workflows=40, size=(4, 20))
    wfs = generate_workflows(sc, 5)
    sim = Simulator(sc, wfs, seed=5, keep_log=True)
    sim.run(make_policy("heft", 5))  # declared requests: some tasks are OOM-killed
    assert sim.log is not None
    assert any(r.outcome == "oom" for r in sim.log)
    ids = await _heartbeats(rstate, sim)
    await _reserve(rstate, sim.log, {wf.id: wf for wf in wfs}, ids)
    events = [_event(r, ids[r.node]) for r in sim.log]
    await rstate.apply_events(events[: len(events) // 2])
    await rstate.apply_events(events)  # the first half redelivered: counted once
    await rstate.apply_event(events[-1])

    families = sorted(sim.history.families)
    stored = await rstate.history.stats(families)
    assert set(stored) == set(families)
    for f in families:
        want, got = sim.history.families[f], stored[f]
        assert (got.count, got.ooms) == (want.count, want.ooms), f
        assert got.oom_limit == pytest.approx(want.oom_limit)
        assert got.last_runtimes == pytest.approx(want.last_runtimes)
        for name in ("cpu", "mem", "runtime"):
            a, b = getattr(want, name), getattr(got, name)
            assert b.total == pytest.approx(a.total)
            for q in (0.1, 0.5, 0.9):
                assert b.percentile(q) == a.percentile(q), (f, name, q)


async def test_the_daemons_observation_equals_the_simulators_history_included(
    rstate: RedisState, settings: Settings
) -> None:
    """For the same events, a task observed with the daemon's history (from Redis) has the
    same features as observed with the simulator's: history, predictions and anchor."""
    sc = _small(settings, workflows=25, size=(4, 16))
    wfs = generate_workflows(sc, 8)
    sim = Simulator(sc, wfs, seed=8, keep_log=True)
    policy = make_policy("heft_history", 8)
    ids = await _heartbeats(rstate, sim)
    by_id = {wf.id: wf for wf in wfs}
    fed, compared = 0, 0
    while (batch := sim.advance()) is not None:
        assert sim.log is not None
        if sim.log[fed:]:
            await _reserve(rstate, sim.log[fed:], by_id, ids)
            await rstate.apply_events([_event(r, ids[r.node]) for r in sim.log[fed:]])
        fed = len(sim.log)
        view = cluster_view(sim)
        families = sorted({t.spec.family for t in batch})
        stored = await rstate.history.stats(families)
        for t in batch:
            ours = observe(view, task_view(t, sim))
            theirs = observe(
                view, replace(task_view(t), history=summarize(stored.get(t.spec.family)))
            )
            np.testing.assert_array_equal(ours.cluster, theirs.cluster)
            np.testing.assert_array_equal(ours.nodes, theirs.nodes)
            np.testing.assert_array_equal(ours.base, theirs.base)
            compared += task_view(t, sim).history is not None
        sim.apply(policy.decide(sim, batch), batch)
    assert compared > 50  # most tasks had a family history to compare
