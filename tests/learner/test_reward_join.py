"""The online learner's join rebuilds, attempt by attempt, the reward the simulator computed,
from nothing but the wire messages a replay of the same run would publish."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from dagsched.core.observation import observation_to_dict, observe
from dagsched.core.wire import to_message
from dagsched.learner.joining import Joined, OutcomeJoiner
from dagsched.schemas.messages import (
    DecisionLogMsg,
    DecisionMsg,
    NodeHeartbeatMsg,
    TaskReadyMsg,
    TaskStartedMsg,
)
from dagsched.sim.engine import Simulator
from dagsched.sim.executor import end_message
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.runs import TaskRun
from dagsched.sim.snapshot import cluster_view, task_view
from tests.sim.conftest import small_scenario


def test_joined_reward_equals_the_simulators_attempt_by_attempt() -> None:
    # declared-request HEFT on the faithful world: OOM kills, retries, failed workflows
    sc = small_scenario(workflows=30, node_failure_per_hour=0.0, transient=0.2)
    wfs = generate_workflows(sc, 3)
    truth: dict[tuple[str, int], float] = {}
    terms: dict[tuple[str, int], TaskOutcome] = {}

    def on_outcome(t: TaskRun, o: TaskOutcome, r: float) -> None:
        truth[(t.key, t.attempt)] = r
        terms[(t.key, t.attempt)] = o

    sim = Simulator(sc, wfs, seed=3, keep_log=True, on_outcome=on_outcome)
    ids = [f"node-{i:04d}" for i in range(sim.cluster.n)]
    seq = itertools.count()
    wire: list[tuple[float, int, Any]] = []

    def emit(at: float, msg: Any) -> None:
        wire.append((at, next(seq), msg))

    for i, info in enumerate(sim.cluster.nodes):
        emit(0.0, NodeHeartbeatMsg(node=ids[i], at=0.0, kind=info.kind, zone=info.zone,  # type: ignore[arg-type]
                                   cores=info.cores, mem_gb=info.mem_gb))  # fmt: skip
    published: set[str] = set()
    logged = 0
    policy = make_policy("heft", 3)

    def flush_log() -> None:
        nonlocal logged
        assert sim.log is not None
        for r in sim.log[logged:]:
            emit(r.start_s, TaskStartedMsg(workflow_id=r.wf_id, task=r.idx, attempt=r.attempt,
                                           node=ids[r.node], at=r.start_s))  # fmt: skip
            emit(r.end_s, end_message(r, ids[r.node]))
        logged = len(sim.log)

    while (batch := sim.advance()) is not None:
        for wf_id, run in sim.active.items():
            if wf_id not in published:
                published.add(wf_id)
                emit(run.wf.arrival_s, to_message(run.wf))
        flush_log()
        for d in policy.decide(sim, batch):
            t, now = d.task, sim.now
            wf_id = t.run.wf.id
            common = {"workflow_id": wf_id, "task": t.idx, "attempt": t.attempt}
            obs = observe(cluster_view(sim), task_view(t))  # what the decider saw
            emit(now, TaskReadyMsg(**common, at=now))
            emit(now, DecisionMsg(**common, node=ids[d.node], cpu=d.cpu, mem=d.mem,
                                  max_retries=d.max_retries, model_version="heft",
                                  arm="champion", decided_at=now, latency_ms=0.0))  # fmt: skip
            emit(now, DecisionLogMsg(**common, model_version="heft", arm="champion",
                                     node_index=d.node, unit=[0.5, 0.5, 0.5], decided_at=now,
                                     observation=observation_to_dict(obs)))  # fmt: skip
            sim.place(d)
    flush_log()

    joiner = OutcomeJoiner(sc.reward)
    joined: list[Joined] = []
    for _, _, msg in sorted(wire, key=lambda x: (x[0], x[1])):
        joined += joiner.add(msg, now=0.0)

    m = sim.summary()
    assert m["oom_kills"] > 0 and m["workflows_failed"] > 0
    assert len(joined) >= 0.9 * len(truth)  # all but queued attempts cancelled unstarted
    compared = 0
    for j in joined:
        o = terms[j.key]
        assert j.reward == pytest.approx(truth[j.key], rel=1e-5, abs=1e-6), (j.key, o)
        compared += o.completion_wf_s > 0
    assert compared > len(joined) / 3  # the completion term is exercised, not all zeros
