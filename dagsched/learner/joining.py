"""Joining the serving logs: each decided attempt with its outcome and reward.

`OutcomeJoiner` joins, by (task key, attempt), a decision (`dagsched.decisions`: node and
reservation), its decision-log record (`dagsched.decisionlog`: a task of a `decision_batch`,
whose observation is replayed from the logged view and the workflows, or an older
`decision_log` with the raw observation; the unit action, behaviour log-prob and value), the
workflow (`dagsched.tasks`: deadline and demands)
and the attempt's events (`dagsched.events`: started, finished or failed; heartbeats give node
cores and memory). The reward is `sim.reward.decision_reward` on a `TaskOutcome` built the
way the simulator builds it: cost in dominant-share core-seconds, the measured transfer and
compute seconds the end event carries; the Jain index at decision time (with the decision's
own reservation) comes from the logged observation; the completion term from the stream's
arrivals, ready instants and workflow ends (`learner.completion`). The joined attempts are
what `learner.online.finetune_heads` trains on and what the evaluator's `WorkflowOutcomes`
judges.

An attempt whose end never comes (a lost event, a node gone without a word) gets the default
outcome, failed and cost at demand, once nothing has been heard of it for `timeout_s` on the
job queue's clock (the latest event time seen), not the wall's: a replay plays that clock
faster than real time, or stands it still. An attempt waits in a node's queue or runs for
as long as its work takes, so while its node keeps sending heartbeats it is not lost. One
the job queue asked for again before it started (its node crashed while it waited, or the
decision named a node already gone) never ran: it is dropped, not counted as a failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagsched.core.bounds import ACTION_NAMES
from dagsched.core.observation import NODE_FEATURES, Observation
from dagsched.core.wire import to_workflow
from dagsched.core.workflow import Workflow, downward_finish_s
from dagsched.learner.completion import TimeInSystem
from dagsched.learner.decision_log import LoggedDecision, logged
from dagsched.schemas.messages import (
    DecisionBatchMsg,
    DecisionLogMsg,
    DecisionMsg,
    NodeDownMsg,
    NodeHeartbeatMsg,
    NodeUpMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.sim.config import RewardWeights
from dagsched.sim.reward import TaskOutcome, decision_reward, dominant_core_s, jain_with

Key = tuple[str, int]  # (workflow_id/task, attempt)
_CPU_USED = NODE_FEATURES.index("cpu_used")
_TRANSFER = NODE_FEATURES.index("log_transfer_s")


@dataclass
class Joined:
    """One decided attempt with its outcome and reward (trainable when `observation` is set)."""

    key: Key
    workflow_id: str
    arm: str
    version: str
    reward: float
    failed: bool
    on_time: bool
    end_at: float  # job-queue clock
    max_retries: int
    defaulted: bool = False
    observation: Observation | None = None
    node_index: int = 0
    unit: list[float] | None = None
    log_prob: float = 0.0

    @property
    def trainable(self) -> bool:
        """It carries what a policy-gradient step needs: the observation, and the action's
        unit values in the current head's shape (a version that logged three values, before
        the priority head, cannot be evaluated by a four-value head)."""
        return (
            self.observation is not None
            and self.unit is not None
            and len(self.unit) == len(ACTION_NAMES)
        )


# attempts kept waiting for their other half; past this the oldest are given up (a stream
# that loses many events must not grow the joiner without bound)
MAX_PENDING = 200_000


@dataclass
class _Pending:
    decision: DecisionMsg | None = None
    log: LoggedDecision | None = None
    started_at: float | None = None
    ended: TaskFinishedMsg | TaskFailedMsg | None = None
    seen_wall: float = 0.0  # wall time first seen: how long to wait for the decision log
    heard_at: float | None = None  # job-queue time of the latest word of it (None: no clock yet)
    superseded: bool = False  # the job queue asked for a later attempt of the task


@dataclass
class _WorkflowInfo:
    wf: Workflow
    finish: list[float]
    cp: float


@dataclass
class OutcomeJoiner:
    """Joins decisions, decision logs, workflows and task events into `Joined` outcomes."""

    weights: RewardWeights
    timeout_s: float = 600.0
    max_dag_tasks: int = 5000
    wait_for_log: bool = True  # the evaluator needs no observation: join without waiting
    workflows: dict[str, _WorkflowInfo] = field(default_factory=dict)
    cores: dict[str, float] = field(default_factory=dict)
    mem_gb: dict[str, float] = field(default_factory=dict)
    pending: dict[Key, _Pending] = field(default_factory=dict)
    last_node: dict[str, str] = field(default_factory=dict)
    waiting: dict[str, set[Key]] = field(default_factory=dict)  # workflow id -> keys
    time_in_system: TimeInSystem = field(default_factory=TimeInSystem)
    clock: float | None = None  # the job queue's: the latest event time seen
    heard_from: dict[str, float] = field(default_factory=dict)  # node -> its latest heartbeat

    def add(self, msg: Any, now: float) -> list[Joined]:
        """Take one decoded message (seen at wall time `now`); return what it completes."""
        at = getattr(msg, "at", None)
        # the events' own clock: requests may be read ahead of the events they follow
        if at is not None and not isinstance(msg, TaskReadyMsg):
            self.clock = at if self.clock is None else max(self.clock, at)
        if isinstance(msg, WorkflowMsg):
            wf = to_workflow(msg, self.max_dag_tasks)
            finish = downward_finish_s(wf)
            self.workflows[wf.id] = _WorkflowInfo(wf, finish, max(finish) or 1.0)
            self.time_in_system.workflow(wf.id, wf.arrival_s, wf.deadline_s, wf.size)
            # topics interleave: decisions and events may have come before their workflow
            out: list[Joined] = []
            for key in self.waiting.pop(wf.id, set()):
                p = self.pending.get(key)
                if p is not None:
                    out += self._try(key, p, now)
            return out
        if isinstance(msg, NodeHeartbeatMsg):
            self.cores[msg.node] = msg.cores
            self.mem_gb[msg.node] = msg.mem_gb
            self.heard_from[msg.node] = msg.at
            return []
        if isinstance(msg, NodeDownMsg):
            self.heard_from.pop(msg.node, None)  # what it held is heard of by its own events
            return []
        if isinstance(msg, NodeUpMsg):
            self.heard_from[msg.node] = msg.at
            return []
        if isinstance(msg, TaskReadyMsg):
            task = f"{msg.workflow_id}/{msg.task}"
            if msg.at is not None:
                self.time_in_system.ready((task, msg.attempt), msg.at)
            self._supersede(task, msg.attempt)
            return []
        if isinstance(msg, DecisionLogMsg | DecisionBatchMsg):
            done: list[Joined] = []
            for entry in logged(msg):
                p = self.pending.get(entry.key)
                if p is None:
                    p = self.pending[entry.key] = _Pending(seen_wall=now, heard_at=self.clock)
                p.log = p.log or entry
                done += self._try(entry.key, p, now)
            return done
        if not isinstance(msg, DecisionMsg | TaskStartedMsg | TaskFinishedMsg | TaskFailedMsg):
            return []
        key = (f"{msg.workflow_id}/{msg.task}", msg.attempt)
        p = self.pending.get(key)
        if p is None:
            p = self.pending[key] = _Pending(seen_wall=now)
        p.heard_at = self.clock
        if isinstance(msg, DecisionMsg):
            p.decision = p.decision or msg
        elif isinstance(msg, TaskStartedMsg):
            p.started_at = msg.at
        else:
            p.ended = p.ended or msg
            self._track_end(msg, p)
        return self._try(key, p, now)

    def _track_end(self, msg: TaskFinishedMsg | TaskFailedMsg, p: _Pending) -> None:
        """Workflows leave the system with their last task, or a task out of retries."""
        tis = self.time_in_system
        if isinstance(msg, TaskFinishedMsg):
            tis.finished(msg.workflow_id, msg.task, msg.at)
        elif (
            msg.reason != "cancelled"
            and p.decision is not None
            and msg.attempt >= p.decision.max_retries
        ):
            tis.failed(msg.workflow_id, msg.at)

    def _supersede(self, task: str, attempt: int) -> None:
        """The job queue asks for `attempt` of `task` (its request, on the tasks topic every
        joiner reads, comes before the decision): the earlier attempts not yet ended are
        done with (one that never started is dropped when it times out)."""
        for a in range(attempt):
            p = self.pending.get((task, a))
            if p is not None and p.ended is None:
                p.superseded = True

    def expire(self, now: float) -> list[Joined]:
        """Default outcomes for decided attempts not heard of for `timeout_s` of the job
        queue's clock, counting the heartbeats of their node while it is up and the
        attempt is not superseded; a superseded one that never started is dropped. `now`
        (the wall) times the wait for a decision log that never comes."""
        out: list[Joined] = []
        clock = self.clock
        over = len(self.pending) - MAX_PENDING
        for key, p in list(self.pending.items()):
            if over > 0:  # the oldest first (insertion order)
                over -= 1
            elif not self._lost(p, clock, now):
                continue
            d = p.decision
            if d is not None:
                self.waiting.pop(d.workflow_id, None)
            never_ran = p.superseded and p.started_at is None and p.ended is None
            if d is not None and d.workflow_id in self.workflows and not never_ran:
                # an outcome whose decision log never came is still an outcome
                out.append(self._join(key, p, default=p.ended is None))
            del self.pending[key]
        return out

    def _lost(self, p: _Pending, clock: float | None, now: float) -> bool:
        if p.decision is not None and p.ended is not None:
            # joined by `_try` once its log comes; this long without it, joined without
            return now - p.seen_wall >= self.timeout_s
        if clock is None:
            return False
        if p.heard_at is None:
            p.heard_at = clock  # first seen before any event carried the time
            return False
        last = p.heard_at
        d = p.decision
        if d is not None and not p.superseded:
            last = max(last, self.heard_from.get(d.node, last))  # its node is up
        return clock - last >= self.timeout_s

    def _try(self, key: Key, p: _Pending, now: float) -> list[Joined]:
        d = p.decision
        if d is None or p.ended is None:
            return []
        if d.workflow_id not in self.workflows:
            self.waiting.setdefault(d.workflow_id, set()).add(key)
            return []
        waiting = self.wait_for_log and d.arm != "fallback" and p.log is None
        if waiting and now - p.seen_wall < self.timeout_s / 10:
            return []  # the observation is on its way on the decision log
        if p.log is not None and now - p.seen_wall < self.timeout_s:
            # a batch's observations replay in the order its tasks were placed, so every
            # workflow of the batch is needed, not only this decision's
            missing = [w for w in p.log.workflow_ids if w not in self.workflows]
            for w in missing:
                self.waiting.setdefault(w, set()).add(key)
            if missing:
                return []
        del self.pending[key]
        return [self._join(key, p, default=False)]

    def _workflow(self, wf_id: str) -> Workflow | None:
        info = self.workflows.get(wf_id)
        return info.wf if info is not None else None

    def _join(self, key: Key, p: _Pending, default: bool) -> Joined:
        d = p.decision
        assert d is not None
        info = self.workflows[d.workflow_id]
        spec = info.wf.tasks[d.task]
        obs = p.log.observation(self._workflow) if p.log is not None else None
        cores = self.cores.get(d.node, spec.cpu_cores / d.cpu)
        mem_gb = self.mem_gb.get(d.node, spec.mem_gb / d.mem)
        ideal = dominant_core_s(
            spec.cpu_cores / cores, spec.mem_gb / mem_gb, cores, spec.duration_s
        )
        measured_transfer = measured_compute = None
        if p.ended is None or default:
            failed, late, reserved, held, end_at = True, 0.0, ideal, 0.0, 0.0
        else:
            end_at = p.ended.at
            start = p.started_at if p.started_at is not None else end_at
            held = max(0.0, end_at - start)
            failed = isinstance(p.ended, TaskFailedMsg)
            sub = info.wf.arrival_s + info.wf.deadline_s * info.finish[d.task] / info.cp
            late = 0.0 if failed else max(0.0, end_at - sub)
            reserved = dominant_core_s(d.cpu, d.mem, cores, held)
            if p.ended.runtime_s > 0 or p.ended.transfer_s > 0:  # what the node measured
                measured_transfer, measured_compute = p.ended.transfer_s, p.ended.runtime_s
        transfer = 0.0
        jain_at = 1.0
        if obs is not None and p.log is not None and p.log.node_index < obs.nodes.shape[0]:
            transfer = float(np.expm1(obs.nodes[p.log.node_index, _TRANSFER]))
            used = obs.nodes[:, _CPU_USED].astype(np.float64)
            old = float(used[p.log.node_index])
            jain_at = jain_with(float(used.sum()), float((used * used).sum()), len(used), old,
                                old + d.cpu)  # fmt: skip
        if measured_transfer is not None and measured_compute is not None:
            transfer, compute = measured_transfer, measured_compute
        else:
            compute = max(0.0, held - transfer)
        prev = self.last_node.get(key[0]) if key[1] > 0 else None
        self.last_node[key[0]] = d.node
        outcome = TaskOutcome(
            lateness=late / info.wf.deadline_s,
            failed=failed,
            reserved_core_s=reserved,
            ideal_core_s=ideal,
            jain_at_decision=jain_at,
            migrated=prev is not None and prev != d.node,
            transfer_s=transfer,
            compute_s=compute,
            completion_wf_s=self.time_in_system.credit(key),
        )
        log = p.log
        return Joined(
            key=key,
            workflow_id=d.workflow_id,
            arm=d.arm,
            version=d.model_version,
            reward=decision_reward(outcome, self.weights),
            failed=failed,
            on_time=not failed and late <= 0.0,
            end_at=end_at,
            max_retries=d.max_retries,
            defaulted=default,
            observation=obs,
            node_index=log.node_index if log is not None else 0,
            unit=log.unit if log is not None else None,
            log_prob=log.log_prob if log is not None else 0.0,
        )
