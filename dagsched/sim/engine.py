"""Discrete-event simulator: workflows arrive, tasks become ready, a policy places them,
nodes run, fail and recover.

One `heapq` of `(time, seq, kind, obj, token)` drives everything; `seq` breaks ties so the run
is deterministic, and `token` lets a finished or failed attempt's stale events be ignored.
The simulator owns its random generators (one stream per concern, spawned from the seed) and
does no I/O.

Time semantics of one attempt on a node: the reservation is taken at `start_s`; the task
first waits for its inputs from parents on other nodes (the slowest transfer) and its cold
start, then computes from `compute_start_s`. Nodes backfill: an attempt whose reservation fits
in what the node has free starts now, even while others wait in the node's queue. A node's
queue drains by the decisions' priority (higher first), then in the order attempts were
queued, first fit: when room frees up, every waiting attempt that fits starts, in that order
(as the Kubernetes scheduler binds pending pods by priority, any that fits); the daemon's
reservation ledger and every view model the same rule.

Tasks run on their hidden truth (`sim.truth`), not on what they declared: the compute time is
`true duration / speed x max(1, cores really used / cores reserved)`; a memory reservation
below the real peak is OOM-killed when usage (growing linearly with progress) crosses it. What
an attempt measurably used (core-seconds, peak memory, compute seconds) is recorded in
`history` and in the attempt log, as a node agent would report it. Completed outputs are
assumed durable: a node failure loses running attempts, not finished outputs.

The engine holds its collaborators, each owning its state: the fault model (`sim.faults`:
when nodes crash and come back, the drift and the shift in effect), the attempt ledger
(`sim.attempts`: the attempt log `AttemptRecord`, each decision's reward, the completion
term) and the usage meter (`sim.usage`). This module holds the run itself: events, arrivals,
placement, starts, queues, finishes and failures.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from dagsched.core.bounds import clamp_placement
from dagsched.core.estimates import advertised_run_s
from dagsched.core.history import History, measured_ratios
from dagsched.core.workflow import Workflow
from dagsched.sim.attempts import AttemptLedger, AttemptRecord, OutcomeHook
from dagsched.sim.cluster import SLOWDOWN_WEIGHT, Cluster
from dagsched.sim.config import DriftConfig, ScenarioConfig, ShiftConfig
from dagsched.sim.events import ARRIVAL, DRIFT, FAIL, FINISH, NODE_DOWN, NODE_UP, SHIFT
from dagsched.sim.faults import Event, FaultModel
from dagsched.sim.metrics import Metrics
from dagsched.sim.reward import jain_with
from dagsched.sim.runs import Decision, FailureKind, Policy, TaskRun, TaskState, WorkflowRun
from dagsched.sim.shift import shifted_start
from dagsched.sim.truth import HiddenTruth, TruthModel
from dagsched.sim.usage import UsageMeter

# Module-level aliases: a global lookup is several times cheaper than an enum class attribute.
_WAITING, _READY, _QUEUED, _RUNNING, _DONE, _CANCELLED = TaskState
_OOM, _TRANSIENT = FailureKind.OOM, FailureKind.TRANSIENT


class PolicyError(RuntimeError):
    """A policy broke the contract: dead node, missing or duplicate decision."""


_heappush, _heappop = heapq.heappush, heapq.heappop
# attempts per task whose transient failure is drawn at arrival with `keyed_attempts` (a
# task that fails more often draws the rest from the run's stream)
KEYED_ATTEMPTS = 4


def queue_key(t: TaskRun) -> tuple[float, int]:
    """Where a queued attempt stands in its node's queue: higher priority first, then the
    order attempts were queued."""
    return (-t.priority, t.queued_seq)


class Simulator:
    """Plays workflows on a cluster. Drive it with `run(policy)` or `advance()`/`apply()`."""

    def __init__(
        self,
        scenario: ScenarioConfig,
        workflows: Iterable[Workflow],
        *,
        seed: int = 0,
        on_outcome: OutcomeHook | None = None,
        keep_log: bool = False,
        truth: TruthModel | None = None,
        history: History | None = None,
        keyed_attempts: bool = False,
    ) -> None:
        """`truth` replaces the hidden truth drawn from the scenario's `TruthConfig` (a replay
        plays on what history learned, `sim.learned_truth`); `history` is what was measured
        before the run (empty by default), which policies read from the first decision.

        `keyed_attempts` draws whether, and when, each of a task's first `KEYED_ATTEMPTS`
        attempts fails on its own when its workflow arrives, so that two policies played on
        one seed meet the same transient failures task by task (common random numbers). By
        default they are drawn as attempts start, from one stream: once two policies start
        one attempt in a different order, every later draw lands on another task."""
        streams = np.random.SeedSequence(seed).spawn(5)
        cluster_rng, fault_rng, task_rng, self._truth_rng = (
            np.random.default_rng(s) for s in streams[:4]
        )
        self._attempt_rng = np.random.default_rng(streams[4]) if keyed_attempts else None
        # Per-attempt draws use the stdlib generator (seeded from the run's SeedSequence):
        # one numpy scalar draw costs ~15x more, and there are millions of them.
        self._random = random.Random(int(task_rng.integers(2**63)))
        self._u: Callable[[], float] = self._random.random
        self.scenario = scenario
        self.cluster = Cluster(
            scenario.cluster, cluster_rng, scenario.faults.transient_task_failure
        )
        self.metrics = Metrics(self.cluster.n)
        self.usage = UsageMeter(self.cluster)  # telemetry and the utilisation metrics
        self.node_use = self.usage.node_use  # measured cores and GB in use per node
        self.weights = scenario.reward
        # only the engine reads the truth
        self.truth: TruthModel = truth if truth is not None else HiddenTruth(scenario.truth, seed)
        # what has been measured: policies may read it
        self.history = history if history is not None else History()
        self.ledger = AttemptLedger(
            self.cluster,
            self.metrics,
            self.usage,
            self.weights,
            on_outcome=on_outcome,
            keep_log=keep_log,
        )
        self.faults = FaultModel(scenario.faults, self.cluster, fault_rng)
        self.now = 0.0
        self.active: dict[str, WorkflowRun] = {}
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = itertools.count()
        self._queued = itertools.count()  # queue order, for equal priorities
        self._ready: list[TaskRun] = []
        self._stalled: list[TaskRun] = []  # ready while every node was down
        self._arrivals: Iterator[Workflow] = iter(workflows)
        self._arrivals_done = False
        self._last_arrival = 0.0
        for node in range(self.cluster.n):
            self._push_event(self.faults.crash(node, 0.0))
        if scenario.drift is not None:
            self._push(scenario.drift.at_s, DRIFT, scenario.drift)
        if scenario.shift is not None:
            self._push(scenario.shift.at_s, SHIFT, scenario.shift)
        self._next_arrival()

    # -- what the collaborators hold ----------------------------------------------------------

    @property
    def on_outcome(self) -> OutcomeHook | None:
        """Called once per decided attempt when it ends: (task, outcome, reward)."""
        return self.ledger.on_outcome

    @on_outcome.setter
    def on_outcome(self, hook: OutcomeHook | None) -> None:
        self.ledger.on_outcome = hook

    @property
    def log(self) -> list[AttemptRecord] | None:
        """The attempt log (with `keep_log`), oldest first."""
        return self.ledger.log

    @property
    def drifted_at(self) -> float | None:
        """When the drift was applied (None if it has not been)."""
        return self.faults.drifted_at

    @property
    def shifted_at(self) -> float | None:
        """When the shift was switched on (None if it has not been)."""
        return self.faults.shifted_at

    # -- driving ------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """No workflow in flight and none left to arrive."""
        return self._arrivals_done and not self.active

    def run(
        self,
        policy: Policy,
        *,
        until: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> dict[str, Any]:
        """Run to the end (or simulated time `until`) and return the metrics summary."""
        ended = 0
        while (batch := self.advance(until)) is not None:
            self.apply(policy.decide(self, batch), batch)
            if progress is not None:
                n = self.metrics.workflows_done + self.metrics.workflows_failed
                if n != ended:
                    ended = n
                    progress(n)
        if progress is not None:  # the last workflows end after the last decision
            progress(self.metrics.workflows_done + self.metrics.workflows_failed)
        return self.summary()

    def advance(self, until: float | None = None) -> list[TaskRun] | None:
        """Process events until some tasks need a decision; None when the run is over."""
        heap = self._heap
        while True:
            if self._ready:
                batch = [t for t in self._ready if t.state == _READY]
                self._ready = []
                if batch:
                    if self.cluster.n_alive:
                        return batch
                    self._stalled.extend(batch)
            if self.finished or not heap or (until is not None and heap[0][0] > until):
                return None
            t0 = heap[0][0]
            self.now = t0
            while heap and heap[0][0] == t0:
                _, _, kind, obj, token = _heappop(heap)
                self._handle(kind, obj, token)

    def apply(self, decisions: Iterable[Decision], batch: list[TaskRun]) -> None:
        """Place each decided task; every task of `batch` must get exactly one decision."""
        for d in decisions:
            self.place(d)
        for t in batch:
            if t.state == _READY:
                raise PolicyError(f"no decision for ready task {t.key}")

    def fork(self) -> tuple[Simulator, dict[int, Any]]:
        """An independent copy for look-ahead planning, and the deepcopy memo mapping
        `id(original object)` to its copy. Immutable parts (workflows, the network, the
        scenario) are shared; hooks and the attempt log are not carried over."""
        rest = list(self._arrivals)
        self._arrivals = iter(rest)
        memo: dict[int, Any] = {id(wf): wf for wf in rest}
        for run in self.active.values():
            memo[id(run.wf)] = run.wf
        for shared in (self.cluster.network, self.cluster.nodes, self.scenario, self.weights):
            memo[id(shared)] = shared
        ledger = self.ledger
        hook, log = ledger.on_outcome, ledger.log
        ledger.on_outcome, ledger.log = None, None
        try:
            clone = copy.deepcopy(self, memo)
        finally:
            ledger.on_outcome, ledger.log = hook, log
        # deepcopy keeps a bound builtin method as is: rebind to the copy's own generator, or
        # the fork's rollouts would consume the real run's draws
        clone._u = clone._random.random
        return clone, memo

    def summary(self) -> dict[str, Any]:
        """Metrics so far, plus the measured node failure rate."""
        out = self.metrics.summary(self.usage.shares())
        up = self.metrics.node_up_s + self.faults.up_seconds(self.now)
        out["node_hours"] = up / 3600.0
        out["sim_time_s"] = self.now
        return out

    # -- events -------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, obj: Any, token: int = 0) -> None:
        _heappush(self._heap, (at, next(self._seq), kind, obj, token))

    def _push_event(self, event: Event | None) -> None:
        if event is not None:
            at, kind, obj, token = event
            _heappush(self._heap, (at, next(self._seq), kind, obj, token))

    def _handle(self, kind: int, obj: Any, token: int) -> None:
        if kind == FINISH:
            if obj.token == token and obj.state == _RUNNING:
                self._finish(obj)
        elif kind == ARRIVAL:
            self._arrive(obj)
        elif kind == FAIL:
            task, why = obj
            if task.token == token and task.state == _RUNNING:
                self._fail(task, why)
        elif kind == NODE_DOWN:
            if self.faults.is_current(obj, token):
                self._node_down(obj)
        elif kind == NODE_UP:
            self._node_up(obj)
        elif kind == DRIFT:
            self.drift(obj)
        elif kind == SHIFT:
            self.shift(obj)

    def _next_arrival(self) -> None:
        wf = next(self._arrivals, None)
        if wf is None:
            self.usage.stop(self.now)  # the busy window ends with the last arrival
            self._arrivals_done = True
            return
        if wf.arrival_s < self._last_arrival:
            raise ValueError(f"workflow {wf.id} arrives before the one before it")
        if wf.id in self.active:
            raise ValueError(f"workflow id {wf.id} is already in flight")
        self._last_arrival = wf.arrival_s
        self._push(max(wf.arrival_s, self.now), ARRIVAL, wf)

    def _arrive(self, wf: Workflow) -> None:
        run = WorkflowRun(wf)
        self.active[wf.id] = run
        m = self.metrics
        if m.first_arrival == float("inf"):
            m.first_arrival = self.now
            self.usage.start(self.now)
        m.enter(self.now)
        ratios = self.truth.draw(wf, self._truth_rng, self.faults.mem_spread).tolist()
        for t, (cpu, mem, rt) in zip(run.tasks, ratios, strict=True):
            t.use_cores = t.spec.cpu_cores * cpu
            t.peak_mem = t.spec.mem_gb * mem
            t.true_s = t.spec.duration_s * rt
        if self._attempt_rng is not None:
            draws = self._attempt_rng.random((len(run.tasks), KEYED_ATTEMPTS, 2)).tolist()
            for t, d in zip(run.tasks, draws, strict=True):
                t.draws = d
        for t in run.tasks:
            if t.waiting_parents == 0:
                self._make_ready(t)
        self._next_arrival()

    def _make_ready(self, t: TaskRun) -> None:
        t.state = _READY
        t.ready_s = self.now
        self._ready.append(t)

    # -- placement ----------------------------------------------------------------------------

    def place(self, d: Decision) -> None:
        """Place one ready task now (a queue wait if it does not fit); checks the contract."""
        t, node, cpu, mem, retries, priority = d
        c = self.cluster
        if t.state != _READY:
            raise PolicyError(f"decision for {t.key}, which is {t.state.name}, not READY")
        if not (0 <= node < c.n) or not c.alive[node]:
            raise PolicyError(f"decision for {t.key} picks dead or unknown node {node}")
        t.node = node
        t.cpu, t.mem, t.max_retries = cpu, mem, _ = clamp_placement(cpu, mem, retries)
        t.priority = float(priority)
        t.res_cores = res_cores = cpu * c.cores_list[node]
        t.res_mem = res_mem = mem * c.mem_list[node]
        old = 1.0 - c.free_cores[node] / c.cores_list[node]
        t.decided_jain = jain_with(c._sum_x, c._sum_x2, c.n, old, old + cpu)
        self.ledger.credit(t, self.now)
        m = self.metrics
        m.decisions += 1
        if t.prev_node >= 0 and t.prev_node != node:
            m.migrations += 1
        if c.fits(node, res_cores, res_mem):
            self._start(t)  # backfill: it fits now, whatever waits in the queue
        else:
            t.state = _QUEUED
            t.queued_seq = next(self._queued)
            bisect.insort(c.queues[node], t, key=queue_key)
            c.queue_len[node] += 1
            c.queued_core_s[node] += self._est_core_s(t)

    def _est_core_s(self, t: TaskRun) -> float:
        return t.res_cores * t.spec.duration_s / self.cluster.speed_rows[t.node][t.spec.type]

    def _start(self, t: TaskRun) -> None:
        c, node, now, spec = self.cluster, t.node, self.now, t.spec
        c.reserve(node, t.res_cores, t.res_mem)
        self.ledger.hold(t, 1.0, now)
        c.running[node].add(t)
        t.state = _RUNNING
        t.start_s = now
        t.token += 1
        m = self.metrics
        m.wait_sum += now - t.ready_s
        m.wait_n += 1
        xfer = nbytes = 0.0
        tasks, net = t.run.tasks, c.network
        for p in t.run.wf.parents[t.idx]:
            parent = tasks[p]
            if parent.node != node:
                s = net.transfer_s(parent.node, node, parent.spec.output_bytes)
                xfer = s if s > xfer else xfer
                nbytes += parent.spec.output_bytes
        t.transfer_s, t.transfer_bytes = xfer, nbytes
        if nbytes > 0:
            c.receive(node, now, now + xfer, nbytes)
        speed = c.speed_rows[node][spec.type]
        # what the node expects from the declaration (for its measured slowdown)...
        t.advertised_s = advertised_run_s(spec.duration_s, speed, spec.cpu_cores, t.res_cores)
        # ...and what really happens: CPU reserved below real use runs proportionally slower
        throttle = t.use_cores / t.res_cores
        actual = t.true_s / speed * c.slowdown[node]
        t.compute_s = actual * throttle if throttle > 1 else actual
        t.compute_start_s = now + xfer + spec.cold_start_s
        if (shift := self.faults.shift) is not None:
            own = t.use_cores if t.use_cores < t.res_cores else t.res_cores
            shifted_start(shift, t, self.node_use[node][0] - own, c.cores_list[node])
        if t.res_mem < t.peak_mem:  # memory grows with progress until it crosses the limit
            at = t.compute_start_s + t.compute_s * t.res_mem / t.peak_mem
            self._push(at, FAIL, (t, _OOM), t.token)
        elif (self._u() if t.draws is None else self._keyed_u(t, 0)) < c.transient_failure[node]:
            at = t.compute_start_s + t.compute_s * (
                self._u() if t.draws is None else self._keyed_u(t, 1)
            )
            self._push(at, FAIL, (t, _TRANSIENT), t.token)
        else:
            self._push(t.compute_start_s + t.compute_s, FINISH, t, t.token)

    def _keyed_u(self, t: TaskRun, i: int) -> float:
        """Uniform `i` of `t`'s current attempt (0: does it fail on its own, 1: when), drawn at
        its workflow's arrival (`keyed_attempts`); past `KEYED_ATTEMPTS`, the run's stream's.
        Runs without keyed draws read the stream inline: this is the hot path."""
        assert t.draws is not None
        if t.attempt < KEYED_ATTEMPTS:
            return float(t.draws[t.attempt][i])
        return self._u()

    def _drain(self, node: int) -> None:
        """Start every queued attempt that fits now, in queue order: by priority, then the
        order queued (first fit: a blocked head does not hold back smaller attempts)."""
        c = self.cluster
        q = c.queues[node]
        if not q or not c.alive[node]:
            return
        started = False
        for t in q:
            if c.fits(node, t.res_cores, t.res_mem):
                c.queue_len[node] -= 1
                c.queued_core_s[node] -= self._est_core_s(t)
                self._start(t)
                started = True
        if started:  # keep the ones still waiting, in order
            q[:] = [t for t in q if t.state == _QUEUED]

    # -- finishes -----------------------------------------------------------------------------

    def _finish(self, t: TaskRun) -> None:
        # the node's measured slowdown moves towards this task's observed / advertised time
        seen, node = self.cluster.observed_slowdown, t.node
        ratio = (self.now - t.compute_start_s) / t.advertised_s
        seen[node] += SLOWDOWN_WEIGHT * (ratio - seen[node])
        self.ledger.outcome(t, False, self.now)
        used, peak, computed = self.ledger.end(t, "done", self.now)
        spec = t.spec
        self.history.finished(
            spec.family,
            measured_ratios(
                spec.duration_s,
                spec.cpu_cores,
                spec.mem_gb,
                self.cluster.speed_rows[node][spec.type],
                computed,
                used,
                peak,
            ),
            self.now,
        )
        t.state = _DONE
        self.metrics.tasks_done += 1
        run = t.run
        run.remaining -= 1
        for ci in run.wf.children[t.idx]:
            child = run.tasks[ci]
            child.waiting_parents -= 1
            if child.waiting_parents == 0:
                self._make_ready(child)
        if run.remaining == 0:
            del self.active[run.wf.id]
            self.metrics.workflow_finished(run.wf.arrival_s, self.now, run.wf.deadline_s)
            self.usage.mark_warm(self.now)
            run.tasks = []  # break the run <-> task cycle: freed now, not at the next full GC
        self._drain(t.node)

    # -- failed attempts and workflows --------------------------------------------------------

    def _fail(self, t: TaskRun, why: FailureKind) -> None:
        now, ledger = self.now, self.ledger
        ledger.outcome(t, True, now)
        ledger.end(t, why.name.lower(), now)
        node = t.node
        self.metrics.task_failures += 1
        if why == _OOM:
            self.metrics.oom_kills += 1
            self.history.oom(t.spec.family, t.res_mem / t.spec.mem_gb, now)
        self.cluster.record_failure(node, now)
        t.after_oom = why == _OOM
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
        c, now, ledger = self.cluster, self.now, self.ledger
        run.failed = True
        del self.active[run.wf.id]
        self.usage.mark_warm(now)
        self.metrics.workflow_failed(now)
        # a failed workflow counts as in the system until its deadline: giving up never pays
        ledger.charge(max(0.0, run.wf.arrival_s + run.wf.deadline_s - now))
        touched: set[int] = set()
        for t in run.tasks:
            if t.state == _RUNNING:
                ledger.outcome(t, True, now)  # its remaining tasks are not free
                ledger.end(t, "cancelled", now)
                touched.add(t.node)
            elif t.state == _QUEUED:
                c.queues[t.node].remove(t)
                c.queue_len[t.node] -= 1
                c.queued_core_s[t.node] -= self._est_core_s(t)
                t.start_s = t.compute_start_s = now  # it held nothing
                t.transfer_s = 0.0
                ledger.outcome(t, True, now)
            if t.state != _DONE:
                t.state = _CANCELLED
        run.tasks = []  # break the run <-> task cycle: freed now, not at the next full GC
        for node in sorted(touched):
            self._drain(node)

    # -- node faults and world changes --------------------------------------------------------

    def _node_down(self, node: int) -> None:
        c = self.cluster
        if not c.alive[node]:
            return
        c.set_alive(node, False)
        up_s, repair = self.faults.went_down(node, self.now)
        self.metrics.node_failures += 1
        self.metrics.node_up_s += up_s
        for t in sorted(c.running[node], key=lambda t: (t.run.wf.id, t.idx)):
            if t.state == _RUNNING:
                self._fail(t, FailureKind.NODE_DOWN)
        for t in c.queues[node]:  # queued work moves elsewhere: it never started here
            t.prev_node = node
            self._make_ready(t)
        c.queues[node].clear()
        c.queue_len[node] = 0
        c.queued_core_s[node] = 0.0
        c.inbound[node].clear()
        self._push_event(repair)

    def _node_up(self, node: int) -> None:
        self.cluster.set_alive(node, True)
        self._push_event(self.faults.came_up(node, self.now))
        if self._stalled:
            for t in self._stalled:
                if t.state == _READY:
                    self._ready.append(t)
            self._stalled = []

    def drift(self, d: DriftConfig) -> tuple[int, ...]:
        """Apply `d` now (its `at_s` is ignored); returns the drifted nodes."""
        nodes, crashes = self.faults.drift(d, self.now)
        for crash in crashes:
            self._push_event(crash)
        return nodes

    def shift(self, cfg: ShiftConfig) -> None:
        """Switch the shifted world on now (its `at_s` is ignored)."""
        self.faults.start_shift(cfg, self.now)
