"""The replay's cluster side without Kafka: requests out, decisions in, events out."""

from __future__ import annotations

from collections import Counter

from dagsched.schemas.messages import (
    DecisionMsg,
    NodeHeartbeatMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.sim.engine import Simulator
from dagsched.sim.executor import SimExecutor
from dagsched.sim.runner import generate_workflows, make_policy
from tests.sim.conftest import small_scenario


def _decision(msg: TaskReadyMsg, node: str, cpu: float, mem: float) -> DecisionMsg:
    return DecisionMsg(workflow_id=msg.workflow_id, task=msg.task, attempt=msg.attempt,
                       node=node, cpu=cpu, mem=mem, max_retries=2, model_version="h",
                       arm="fallback", decided_at=0.0, latency_ms=0.0)  # fmt: skip


def test_every_request_is_answered_once_and_every_attempt_reports_start_and_end() -> None:
    sc = small_scenario(workflows=12, node_failure_per_hour=0.0, transient=0.2)
    sim = Simulator(sc, generate_workflows(sc, 4), seed=4, keep_log=True)
    ex = SimExecutor(sim)
    ex.heartbeats()
    policy = make_policy("heft", 4)
    rejected = 0
    while (batch := sim.advance()) is not None:
        ex.events()
        for d in policy.decide(sim, batch):
            msg = ex.request(d.task)
            if msg.attempt == 0 and d.task.idx == 0 and rejected == 0:
                assert not ex.apply(d.task, _decision(msg, "node-9999", d.cpu, d.mem))
                rejected += 1  # a stale answer: asked again as a new wire attempt
                msg = ex.request(d.task)
                assert msg.attempt == 1
            assert ex.apply(d.task, _decision(msg, ex.node_ids[d.node], d.cpu, d.mem))
        ex.events()
    ex.events()  # the last workflows end after the last decision
    out = [m for _, _, m in ex.outbox]
    assert sum(isinstance(m, NodeHeartbeatMsg) for m in out) == sim.cluster.n
    assert sum(isinstance(m, WorkflowMsg) for m in out) == 12  # each published once
    ready = Counter((m.workflow_id, m.task, m.attempt) for m in out if isinstance(m, TaskReadyMsg))
    assert set(ready.values()) == {1}
    started = [(m.workflow_id, m.task, m.attempt) for m in out if isinstance(m, TaskStartedMsg)]
    assert len(started) == len(set(started))
    ends = [m for m in out if isinstance(m, TaskFinishedMsg | TaskFailedMsg)]
    assert {(m.workflow_id, m.task, m.attempt) for m in ends} <= set(started) | set(ready)
    assert any(isinstance(m, TaskFailedMsg) and m.reason == "transient" for m in ends)
    finished = [m for m in ends if isinstance(m, TaskFinishedMsg)]
    assert len(finished) == sim.summary()["tasks"]
    assert all(m.runtime_s > 0 and m.cpu_core_s > 0 and m.peak_mem_gb > 0 for m in finished)
    # the outcomes: every workflow ended, and who served it is known
    outcomes = ex.workflow_outcomes()
    assert len(outcomes) == 12 and all(o.arm == "fallback" for o in outcomes)
    done = [o for o in outcomes if o.end_s is not None]
    assert len(done) == 12 - sim.summary()["workflows_failed"]


def test_every_placed_attempt_reports_its_end_when_its_workflow_fails() -> None:
    """A workflow out of retries cancels its running and queued attempts: each placed attempt
    still reports an end, or the evaluator would wait on it until its timeout."""
    sc = small_scenario(workflows=30, node_failure_per_hour=2.0, transient=0.3)
    sim = Simulator(sc, generate_workflows(sc, 1), seed=1, keep_log=True)
    ex = SimExecutor(sim)
    ex.heartbeats()
    policy = make_policy("heft", 1)
    placed: set[tuple[str, int, int]] = set()
    while (batch := sim.advance()) is not None:
        ex.events()
        for d in policy.decide(sim, batch):
            msg = ex.request(d.task)
            decision = _decision(msg, ex.node_ids[d.node], d.cpu, d.mem)
            if ex.apply(d.task, decision.model_copy(update={"max_retries": 0})):
                placed.add((msg.workflow_id, msg.task, msg.attempt))
        ex.events()
    ex.events()
    out = [m for _, _, m in ex.outbox]
    started = {(m.workflow_id, m.task, m.attempt) for m in out if isinstance(m, TaskStartedMsg)}
    ended = {
        (m.workflow_id, m.task, m.attempt)
        for m in out
        if isinstance(m, TaskFinishedMsg | TaskFailedMsg)
    }
    assert sim.summary()["workflows_failed"] >= 10
    assert any(isinstance(m, TaskFailedMsg) and m.reason == "cancelled" for m in out)
    assert started <= ended and placed == ended
