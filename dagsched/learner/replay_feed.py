"""Where the replay judge's recorded traffic comes from: the wire, or a simulator run.

`MessageFeed` reads the decoded messages the evaluator consumes (`dagsched.tasks`: workflows;
`dagsched.events`: heartbeats, attempt starts and ends, node failures) into a
`TrafficRecorder`, and learns the per-family history from the attempts' end events with the
same arithmetic as the simulator and the daemon's updater (`core.history`); finished
workflows come from the evaluator's per-workflow samples.
`SimFeed` does the same for a simulator run (the in-process loop, `models compare` without
live traffic): arrivals as the generator hands them over, attempt ends from the outcome hook,
nodes and fault counts from what the simulator's node agents would report. Neither reads the
hidden truth: both give the judge what the events carry.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from dagsched.core.history import FamilyStats, History, measured_ratios
from dagsched.core.wire import to_workflow
from dagsched.core.workflow import TASK_TYPE_NAMES, Workflow
from dagsched.learner.replay_judge import ObservedWindow, TrafficRecorder
from dagsched.schemas.messages import (
    NodeDownMsg,
    NodeHeartbeatMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.sim.replay_world import NodeSpec
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import Policy, TaskRun

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


# workflows whose declarations the history reads their tasks' end events against; the
# oldest are dropped past this (a task ending later then teaches the history nothing)
MAX_DECLARED = 20_000


class MessageFeed:
    """Decoded wire messages -> a `TrafficRecorder` and a per-family `History`.

    `speed` is the cluster's speed table (`speed[node kind][task type]`, as the settings
    hold it): a finished attempt's runtime ratio is its compute time at its node's advertised
    speed over the declared duration, as everywhere else."""

    def __init__(
        self,
        recorder: TrafficRecorder,
        max_dag_tasks: int = 5000,
        speed: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        self.recorder = recorder
        self.max_dag_tasks = max_dag_tasks
        self.speed = speed or {}
        self.history = History()
        self._started: dict[tuple[str, int, int], float] = {}
        self._oom: set[tuple[str, int]] = set()  # tasks whose last attempt was OOM-killed
        self._declared: OrderedDict[str, Workflow] = OrderedDict()
        self._kind: dict[str, str] = {}  # node id -> kind, from heartbeats

    def families(self) -> dict[str, FamilyStats]:
        """The per-family history learned so far (a copy: the feed goes on)."""
        return copy.deepcopy(self.history.families)

    def add(self, msg: Any) -> None:
        """Take one message (anything else is ignored)."""
        r = self.recorder
        if isinstance(msg, WorkflowMsg):
            wf = to_workflow(msg, self.max_dag_tasks)
            r.workflow(wf)
            if self.recorder.pending_snapshots:
                self.recorder.snapshot(self.history.families)
            self._declared[wf.id] = wf
            while len(self._declared) > MAX_DECLARED:
                self._declared.popitem(last=False)
        elif isinstance(msg, NodeHeartbeatMsg):
            r.clock(msg.at)
            self._kind[msg.node] = msg.kind
            r.node(msg.node, NodeSpec(msg.kind, msg.zone, msg.cores, msg.mem_gb,
                                      msg.gpu_mem_gb, msg.net_gbps))  # fmt: skip
        elif isinstance(msg, NodeDownMsg):
            r.node_down(msg.at)
        elif isinstance(msg, TaskStartedMsg):
            key = (msg.workflow_id, msg.task, msg.attempt)
            r.clock(msg.at)
            self._started[key] = msg.at
            if (msg.workflow_id, msg.task) in self._oom:
                expected = self._expected_s(msg)
                if expected is not None:
                    r.retry_started(key, msg.at, expected)
        elif isinstance(msg, TaskFinishedMsg | TaskFailedMsg):
            task = (msg.workflow_id, msg.task)
            began = self._started.pop((*task, msg.attempt), None)
            reason = msg.reason if isinstance(msg, TaskFailedMsg) else ""
            failed = isinstance(msg, TaskFailedMsg)
            overhead = None
            if not failed and began is not None and (msg.runtime_s > 0 or msg.transfer_s > 0):
                overhead = (msg.at - began) - msg.runtime_s - msg.transfer_s
            r.attempt_ended(msg.at, failed, reason, overhead, after_oom=task in self._oom,
                            started_s=began, key=(*task, msg.attempt))  # fmt: skip
            if reason == "oom":
                self._oom.add(task)
            else:
                self._oom.discard(task)
            if not failed:
                r.task_finished(msg.workflow_id, msg.task)
            self._learn(msg)

    def _expected_s(self, msg: TaskStartedMsg) -> float | None:
        """How long the attempt `msg` started is expected to compute: its declared duration
        at its node's advertised speed, times its family's predicted runtime ratio (None
        for a task whose declaration is no longer kept)."""
        wf = self._declared.get(msg.workflow_id)
        if wf is None or msg.task >= wf.size:
            return None
        spec = wf.tasks[msg.task]
        speed = self.speed.get(self._kind.get(msg.node, ""), {}).get(TASK_TYPE_NAMES[spec.type])
        stats = self.history.get(spec.family)
        ratio = stats.runtime_ratio() if stats is not None else 1.0
        return spec.duration_s / (speed or 1.0) * ratio

    def _learn(self, msg: TaskFinishedMsg | TaskFailedMsg) -> None:
        """The history's update from one attempt's end: its measured ratios, or the limit
        an OOM kill hit; other failures tell nothing."""
        wf = self._declared.get(msg.workflow_id)
        if wf is None or msg.task >= wf.size:
            return
        spec = wf.tasks[msg.task]
        if isinstance(msg, TaskFailedMsg):
            if msg.reason == "oom" and spec.mem_gb > 0:
                self.history.oom(spec.family, msg.peak_mem_gb / spec.mem_gb, msg.at)
            return
        kind = self._kind.get(msg.node, "")
        speed = self.speed.get(kind, {}).get(TASK_TYPE_NAMES[spec.type], 1.0)
        m = measured_ratios(spec.duration_s, spec.cpu_cores, spec.mem_gb, speed,
                            msg.runtime_s, msg.cpu_core_s, msg.peak_mem_gb)  # fmt: skip
        self.history.finished(spec.family, m, msg.at)


class SimFeed:
    """A simulator run -> a `TrafficRecorder`: wrap the arrivals with `workflows`, chain
    `outcome` into the simulator's outcome hook, and `sync` before taking windows."""

    def __init__(self, recorder: TrafficRecorder) -> None:
        self.recorder = recorder
        self.sim: Simulator | None = None

    def workflows(self, wfs: Iterable[Workflow]) -> Iterator[Workflow]:
        """The arrivals, recorded as the simulator takes them."""
        for wf in wfs:
            self.recorder.workflow(wf)
            if self.recorder.pending_snapshots and self.sim is not None:
                self.recorder.snapshot(self.sim.history.families)
            yield wf

    def attach(self, sim: Simulator) -> None:
        """The run whose nodes and fault counts are read."""
        self.sim = sim
        for info in sim.cluster.nodes:
            self.recorder.node(str(info.id), NodeSpec(info.kind, info.zone, info.cores,
                                                      info.mem_gb, info.gpu_mem_gb,
                                                      info.net_gbps))  # fmt: skip

    def outcome(self, t: TaskRun, o: TaskOutcome, now: float) -> None:
        """One attempt ended at `now` (what its end event would carry)."""
        overhead = None if o.failed else (now - t.start_s) - o.transfer_s - o.compute_s
        self.recorder.attempt_ended(
            now, o.failed, "", overhead, after_oom=t.after_oom, started_s=t.start_s,
            key=(t.run.wf.id, t.idx, t.attempt),
        )  # fmt: skip
        if not o.failed:
            self.recorder.task_finished(t.run.wf.id, t.idx)

    def workflow_ended(
        self,
        wf: Workflow,
        now: float,
        failed: bool,
        served: bool = True,
        version: str | None = None,
    ) -> None:
        """A workflow finished, or ran out of retries, at `now`; `served`: by the serving
        version; `version`: the model version that served it."""
        met = not failed and now <= wf.arrival_s + wf.deadline_s + 1e-9
        self.recorder.ended(wf.id, now - wf.arrival_s, met, served, version)

    def sync(self) -> None:
        """Fault counts as the events would have told them: task failures other than OOM
        kills are transient (node crashes are replayed on their own); the retries after an
        OOM kill still running, as their start events would have told them."""
        assert self.sim is not None
        sim, r = self.sim, self.recorder
        m = sim.metrics
        r.clock(sim.now)
        for running in sim.cluster.running:  # the retries after an OOM kill, as started
            for t in running:
                if t.after_oom:
                    stats = sim.history.get(t.spec.family)
                    ratio = stats.runtime_ratio() if stats is not None else 1.0
                    r.retry_started((t.run.wf.id, t.idx, t.attempt), t.start_s,
                                    t.advertised_s * ratio)  # fmt: skip
        r.attempts = max(r.attempts, m.decisions)
        r.transient = max(0, m.task_failures - m.oom_kills - m.node_failures)
        r.node_downs = m.node_failures

    def families(self) -> dict[str, FamilyStats]:
        """The simulator's per-family history now (a copy: the run goes on), the fault
        counts brought up to date first (`sync`), as a window closes with both."""
        assert self.sim is not None
        self.sync()
        return copy.deepcopy(self.sim.history.families)

    def ready(self) -> list[ObservedWindow]:
        """Windows closed so far."""
        return self.recorder.ready(self.families())


def record_run(
    sim_factory: Any,
    policy: Policy,
    recorder: TrafficRecorder,
    workflows: Iterable[Workflow],
    served: Callable[[str], bool] | None = None,
    as_they_close: bool = False,
) -> list[ObservedWindow]:
    """Play `workflows` under `policy` in `sim_factory(arrivals, hook)` to the end; every
    window the recorder closed. `served(workflow id)`: whether the serving version served
    it (default: every one). By default the windows close when the run ends, all with what
    is known then; `as_they_close` closes each as soon as it can, as the evaluator does,
    with the restart estimate and the history of that moment."""
    feed = SimFeed(recorder)
    closed: list[ObservedWindow] = []

    def hook(t: TaskRun, o: TaskOutcome, _reward: float) -> None:
        assert feed.sim is not None
        now = feed.sim.now
        feed.outcome(t, o, now)
        failed = o.failed and t.failures + 1 > t.max_retries
        if failed or (not o.failed and t.run.remaining == 1):
            wf = t.run.wf
            feed.workflow_ended(wf, now, failed, served(wf.id) if served is not None else True)
            if as_they_close and recorder.closable():
                closed.extend(feed.ready())

    sim = sim_factory(feed.workflows(workflows), hook)
    feed.attach(sim)
    sim.run(policy)
    return [*closed, *feed.ready()]
