"""The cluster side of a replay, without Kafka: the simulator plays the job queue and the
executor, turning decisions into what a real cluster would report.

`SimExecutor` publishes each workflow once and each task attempt as it becomes ready
(`request`), places the decisions it is given (`apply`), and reports what happened since the
last call as wire events (`events`): node heartbeats, node down / up, task started, and each
ended attempt with what was measured of it (`end_message`), never the hidden truth.
Messages collect in `outbox` as (stream, key, message), stream "tasks" or "events"; the Kafka
adapter (`daemon.replay`) sends them, a test can read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from dagsched.core.wire import to_message
from dagsched.core.workflow import Workflow
from dagsched.schemas.messages import (
    DecisionMsg,
    NodeDownMsg,
    NodeHeartbeatMsg,
    NodeUpMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskStartedMsg,
)
from dagsched.sim.attempts import AttemptRecord
from dagsched.sim.engine import Simulator
from dagsched.sim.runs import Decision, TaskRun, TaskState

Message = tuple[str, str, Any]  # ("tasks" | "events", key, wire message)


_FAILURE_REASONS = ("oom", "node_down", "cancelled")


def end_message(
    r: AttemptRecord, node: str, attempt: int | None = None
) -> TaskFinishedMsg | TaskFailedMsg:
    """The end event a node agent reports for an ended attempt: what it measured of it
    (core-seconds, peak memory, compute and input-wait seconds), never the hidden truth.
    `attempt` renumbers it (the job queue's numbering), else the simulator's is kept."""
    common: dict[str, Any] = {
        "workflow_id": r.wf_id,
        "task": r.idx,
        "attempt": r.attempt if attempt is None else attempt,
        "node": node,
        "at": r.end_s,
        "cpu_core_s": r.cpu_core_s,
        "peak_mem_gb": r.peak_mem_gb,
        "runtime_s": r.runtime_s,
        "transfer_s": r.transfer_s,
    }
    if r.outcome == "done":
        return TaskFinishedMsg(**common)
    reason = r.outcome if r.outcome in _FAILURE_REASONS else "transient"
    return TaskFailedMsg(
        **common, reason=cast(Literal["oom", "transient", "node_down", "cancelled"], reason)
    )


@dataclass(frozen=True)
class WorkflowOutcome:
    """One replayed workflow: when it ended (None if it has not), whether by its deadline,
    and the arm and version whose decision it was first served by."""

    workflow_id: str
    arrival_s: float
    end_s: float | None
    met_deadline: bool
    arm: str
    version: str


class SimExecutor:
    """Drives `sim` as the cluster behind a job queue: requests in, decisions in, events out."""

    def __init__(self, sim: Simulator) -> None:
        if sim.log is None:
            raise ValueError(
                "the executor reads the attempt log: build the simulator with keep_log"
            )
        self.sim = sim
        self.node_ids = [f"node-{i:04d}" for i in range(sim.cluster.n)]
        self.outbox: list[Message] = []
        self.published: dict[str, Workflow] = {}
        self.served: dict[str, tuple[str, str]] = {}  # workflow -> (arm, version) first served
        self._requests: dict[str, int] = {}  # task key -> last attempt number asked
        self._placed: dict[str, tuple[int, str]] = {}  # task key -> (wire attempt, node id)
        self._started: set[tuple[str, int]] = set()
        self._queued: set[TaskRun] = set()
        self._done_at: dict[str, dict[int, float]] = {}  # workflow id -> task -> finish time
        self._alive = list(sim.cluster.alive)

    # -- requests and decisions ----------------------------------------------------------------

    def request(self, t: TaskRun) -> TaskReadyMsg:
        """Ask for a decision on a ready task (publishing its workflow the first time); a task
        asked again (its last answer was stale) is a new attempt on the wire."""
        wf = t.run.wf
        if wf.id not in self.published:
            self.published[wf.id] = wf
            self.outbox.append(("tasks", wf.id, to_message(wf)))
        attempt = self._requests.get(t.key, -1) + 1
        self._requests[t.key] = attempt
        msg = TaskReadyMsg(workflow_id=wf.id, task=t.idx, attempt=attempt, at=self.sim.now)
        self.outbox.append(("tasks", wf.id, msg))
        return msg

    def apply(self, t: TaskRun, d: DecisionMsg) -> bool:
        """Place `t` as decided; False when the decision names an unknown or dead node (a
        stale view: ask again)."""
        self.served.setdefault(d.workflow_id, (d.arm, d.model_version))
        node = self.node_ids.index(d.node) if d.node in self.node_ids else -1
        if node < 0 or not self.sim.cluster.alive[node]:
            return False
        self.sim.place(Decision(t, node, d.cpu, d.mem, d.max_retries, d.priority))
        self._placed[t.key] = (d.attempt, d.node)
        if t.state == TaskState.RUNNING:
            self._emit_started(t)
        else:
            self._queued.add(t)
        return True

    # -- events ---------------------------------------------------------------------------------

    def _event(self, node: str, msg: Any) -> None:
        self.outbox.append(("events", node, msg))

    def _emit_started(self, t: TaskRun) -> None:
        attempt, node = self._placed[t.key]
        if (t.key, attempt) in self._started:
            return
        self._started.add((t.key, attempt))
        self._event(node, TaskStartedMsg(workflow_id=t.run.wf.id, task=t.idx, attempt=attempt,
                                         node=node, at=t.start_s))  # fmt: skip

    def events(self) -> None:
        """Report what happened since the last call: node changes, attempt ends, starts."""
        sim = self.sim
        c = sim.cluster
        for i, (was, now) in enumerate(zip(self._alive, c.alive, strict=True)):
            if was != now:
                node = self.node_ids[i]
                cls = NodeUpMsg if now else NodeDownMsg
                self._event(node, cls(node=node, at=sim.now))
                if now:
                    self._heartbeat(i)
        self._alive = list(c.alive)
        assert sim.log is not None
        entries, sim.log[:] = list(sim.log), []
        for r in entries:
            key = f"{r.wf_id}/{r.idx}"
            placed = self._placed.get(key)
            if placed is None:
                continue
            attempt, node = placed
            if (key, attempt) not in self._started:
                self._started.add((key, attempt))
                started = TaskStartedMsg(workflow_id=r.wf_id, task=r.idx, attempt=attempt,
                                         node=node, at=r.start_s)  # fmt: skip
                self._event(node, started)
            if r.outcome == "done":
                self._done_at.setdefault(r.wf_id, {})[r.idx] = r.end_s
            # what a node agent measures of the attempt: the only way the truth gets out
            self._event(node, end_message(r, node, attempt))
        for t in list(self._queued):
            if t.state == TaskState.QUEUED:
                continue
            self._queued.discard(t)
            if t.state == TaskState.RUNNING:
                self._emit_started(t)
            elif t.state == TaskState.CANCELLED and t.key in self._placed:
                attempt, node = self._placed[t.key]
                self._event(node, TaskFailedMsg(workflow_id=t.run.wf.id, task=t.idx,
                                                attempt=attempt, node=node, at=sim.now,
                                                reason="cancelled"))  # fmt: skip

    def heartbeats(self) -> None:
        """A heartbeat of every alive node: its shape and measured use."""
        for i in range(self.sim.cluster.n):
            if self.sim.cluster.alive[i]:
                self._heartbeat(i)

    def _heartbeat(self, i: int) -> None:
        sim = self.sim
        c, info = sim.cluster, sim.cluster.nodes[i]
        self._event(
            self.node_ids[i],
            NodeHeartbeatMsg(
                node=self.node_ids[i],
                at=sim.now,
                kind=info.kind,  # type: ignore[arg-type]
                zone=info.zone,
                cores=info.cores,
                mem_gb=info.mem_gb,
                gpu_mem_gb=info.gpu_mem_gb,
                net_gbps=info.net_gbps,
                # measured use, not the reservation (sums of floats: clamp the rounding)
                used_cores=max(0.0, sim.node_use[i][0]),
                used_mem_gb=max(0.0, sim.node_use[i][1]),
                queue_len=c.queue_len[i],
                net_in_bytes=c.net_in_bytes(i, sim.now),
                failure_rate=c.failure_rate(i, sim.now),
                slowdown=c.observed_slowdown[i],
            ),
        )

    def workflow_outcomes(self) -> list[WorkflowOutcome]:
        """Per workflow published so far: when it ended, whether by its deadline, who served it."""
        out = []
        for wf_id, wf in self.published.items():
            done = self._done_at.get(wf_id, {})
            end = max(done.values()) if len(done) == wf.size else None
            arm, version = self.served.get(wf_id, ("", ""))
            met = end is not None and end <= wf.arrival_s + wf.deadline_s
            out.append(WorkflowOutcome(wf_id, wf.arrival_s, end, met, arm, version))
        return out
