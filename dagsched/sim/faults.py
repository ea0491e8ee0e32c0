"""Failures and the world changes that bring them, as the simulator plays them: an attempt's
failure (OOM kill, transient, its node going down) and its retry, a workflow out of retries,
node crashes and repairs, the drift and the shift.

`FaultHandling` is a base class of `Simulator` (`sim.engine`), which sets up the state
declared here and provides the placement methods it calls; it is kept apart from the engine
so that failures read in one place. Crashes are drawn per node from an exponential at the
node's failure rate, repairs from one at `faults.repair_mean_s`.

A drift (`ScenarioConfig.drift`, or `drift()` at any time) makes some nodes slower than their
advertised speed and raises their failure rates. Policies are not told: `cluster.speed` keeps
the advertised figures, only `cluster.slowdown` (which policies must not read) changes.

A shift (`ScenarioConfig.shift`, or `shift()` at any time) switches on the shifted world's
effects (`sim.shift`): a long restart after an OOM kill, wider memory peaks, noisy
neighbours. Policies are not told either; only outcomes show it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dagsched.core.history import History
from dagsched.sim.attempts import AttemptAccounting
from dagsched.sim.config import DriftConfig, ScenarioConfig, ShiftConfig
from dagsched.sim.events import NODE_DOWN, NODE_UP
from dagsched.sim.runs import FailureKind, TaskRun, TaskState, WorkflowRun

# Module-level aliases: a global lookup is several times cheaper than an enum class attribute.
_WAITING, _READY, _QUEUED, _RUNNING, _DONE, _CANCELLED = TaskState


class FaultHandling(AttemptAccounting):
    """Fails attempts, workflows and nodes, and changes the world; a base of `Simulator`."""

    # set up by `Simulator.__init__`
    scenario: ScenarioConfig
    history: History
    active: dict[str, WorkflowRun]
    _ready: list[TaskRun]
    _stalled: list[TaskRun]  # ready while every node was down
    _fault_rng: np.random.Generator
    _up_since: list[float]
    _fail_rate_s: list[float]  # per node: a drift raises some
    _fault_token: list[int]  # invalidates a node's pending crash on drift
    drifted_at: float | None
    _shift: ShiftConfig | None  # the shift in effect (hidden from policies)
    _mem_spread: float
    shifted_at: float | None

    if TYPE_CHECKING:  # provided by `Simulator`

        def _push(self, at: float, kind: int, obj: Any, token: int = 0) -> None: ...
        def _make_ready(self, t: TaskRun) -> None: ...
        def _est_core_s(self, t: TaskRun) -> float: ...
        def _drain(self, node: int) -> None: ...

    # -- failed attempts and workflows --------------------------------------------------------

    def _fail(self, t: TaskRun, why: FailureKind) -> None:
        self._outcome(t, failed=True)
        self._end_attempt(t, why.name.lower())
        node = t.node
        self.metrics.task_failures += 1
        if why == FailureKind.OOM:
            self.metrics.oom_kills += 1
            self.history.oom(t.spec.family, t.res_mem / t.spec.mem_gb, self.now)
        self.cluster.record_failure(node, self.now)
        t.after_oom = why == FailureKind.OOM
        t.failures += 1
        if t.failures > t.max_retries:
            t.state = _CANCELLED
            self._fail_workflow(t.run)
        else:
            t.prev_node = node
            t.attempt += 1
            self._make_ready(t)
        self._drain(node)

    def _fail_workflow(self, run: WorkflowRun) -> None:
        """Out of retries: cancel everything of the workflow that is still going."""
        c = self.cluster
        run.failed = True
        del self.active[run.wf.id]
        self.usage.mark_warm(self.now)
        self.metrics.workflow_failed(self.now)
        # a failed workflow counts as in the system until its deadline: giving up never pays
        self._charged_wf_s += max(0.0, run.wf.arrival_s + run.wf.deadline_s - self.now)
        touched: set[int] = set()
        for t in run.tasks:
            if t.state == _RUNNING:
                self._outcome(t, failed=True)  # its remaining tasks are not free
                self._end_attempt(t, "cancelled")
                touched.add(t.node)
            elif t.state == _QUEUED:
                c.queues[t.node].remove(t)
                c.queue_len[t.node] -= 1
                c.queued_core_s[t.node] -= self._est_core_s(t)
                t.start_s = t.compute_start_s = self.now  # it held nothing
                t.transfer_s = 0.0
                self._outcome(t, failed=True)
            if t.state != _DONE:
                t.state = _CANCELLED
        run.tasks = []  # break the run <-> task cycle: freed now, not at the next full GC
        for node in sorted(touched):
            self._drain(node)

    # -- node faults --------------------------------------------------------------------------

    def _node_down(self, node: int) -> None:
        c = self.cluster
        if not c.alive[node]:
            return
        c.set_alive(node, False)
        self.metrics.node_failures += 1
        self.metrics.node_up_s += self.now - self._up_since[node]
        for t in sorted(c.running[node], key=lambda t: (t.run.wf.id, t.idx)):
            if t.state == _RUNNING:
                self._fail(t, FailureKind.NODE_DOWN)
        q = c.queues[node]
        while q:  # queued work moves elsewhere: it never started here
            t = q.popleft()
            t.prev_node = node
            self._make_ready(t)
        c.queue_len[node] = 0
        c.queued_core_s[node] = 0.0
        c.inbound[node].clear()
        repair = self._fault_rng.exponential(self.scenario.faults.repair_mean_s)
        self._push(self.now + repair, NODE_UP, node)

    def _node_up(self, node: int) -> None:
        c = self.cluster
        c.set_alive(node, True)
        self._up_since[node] = self.now
        self._schedule_crash(node)
        if self._stalled:
            for t in self._stalled:
                if t.state == _READY:
                    self._ready.append(t)
            self._stalled = []

    def _schedule_crash(self, node: int) -> None:
        rate = self._fail_rate_s[node]
        if rate > 0:
            at = self.now + self._fault_rng.exponential(1 / rate)
            self._push(at, NODE_DOWN, node, self._fault_token[node])

    # -- drift --------------------------------------------------------------------------------

    def drift(self, d: DriftConfig) -> tuple[int, ...]:
        """Apply `d` now (its `at_s` is ignored); returns the drifted nodes.

        Crashes are memoryless, so a live node's pending crash is redrawn at the new rate.
        """
        c = self.cluster
        nodes = d.nodes(c.n)
        for node in nodes:
            c.slowdown[node] *= d.slowdown
            c.transient_failure[node] = min(0.99, c.transient_failure[node] * d.failure_mult)
            self._fail_rate_s[node] *= d.failure_mult
            self._fault_token[node] += 1
            if c.alive[node]:
                self._schedule_crash(node)
        self.drifted_at = self.now
        return nodes

    # -- shift --------------------------------------------------------------------------------

    def shift(self, cfg: ShiftConfig) -> None:
        """Switch the shifted world on now (its `at_s` is ignored): attempts starting from now
        pay its effects, workflows arriving from now draw its memory spread."""
        self._shift = cfg
        self._mem_spread = cfg.mem_spread
        self.shifted_at = self.now
