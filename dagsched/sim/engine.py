"""Discrete-event simulator: workflows arrive, tasks become ready, a policy places them,
nodes run, fail and recover.

One `heapq` of `(time, seq, kind, obj, token)` drives everything; `seq` breaks ties so the run
is deterministic, and `token` lets a finished or failed attempt's stale events be ignored.
The simulator owns its random generators (one stream per concern, spawned from the seed) and
does no I/O.

Time semantics of one attempt on a node: the reservation is taken at `start_s`; the task
first waits for its inputs from parents on other nodes (the slowest transfer) and its cold
start, then computes from `compute_start_s`. Nodes backfill: an attempt whose reservation fits
in what the node has free starts now, even while larger ones wait in the node's queue (first
fit in queue order, as the Kubernetes scheduler binds any pending pod that fits); the daemon's
reservation ledger and every view model the same rule.

Tasks run on their hidden truth (`sim.truth`), not on what they declared: the compute time is
`true duration / speed x max(1, cores really used / cores reserved)`; a memory reservation
below the real peak is OOM-killed when usage (growing linearly with progress) crosses it. What
an attempt measurably used (core-seconds, peak memory, compute seconds) is recorded in
`history` and in the attempt log, as a node agent would report it. Completed outputs are
assumed durable: a node failure loses running attempts, not finished outputs.

Failures, node crashes and repairs, the drift and the shift (`drift()`, `shift()`) are played
by `sim.faults`; an attempt's accounting (the attempt log `AttemptRecord`, its reward, the
completion term) by `sim.attempts`. Both are base classes of `Simulator`: this module holds
the run itself (events, arrivals, placement, starts, queues, finishes).
"""

from __future__ import annotations

import copy
import heapq
import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from dagsched.core.bounds import clamp_placement
from dagsched.core.history import History, measured_ratios
from dagsched.core.workflow import Workflow
from dagsched.sim.attempts import AttemptRecord, OutcomeHook  # AttemptRecord: re-exported
from dagsched.sim.cluster import SLOWDOWN_WEIGHT, Cluster
from dagsched.sim.config import ScenarioConfig, ShiftConfig
from dagsched.sim.events import ARRIVAL, DRIFT, FAIL, FINISH, NODE_DOWN, NODE_UP, SHIFT
from dagsched.sim.faults import FaultHandling
from dagsched.sim.metrics import Metrics
from dagsched.sim.reward import jain_with
from dagsched.sim.runs import Decision, FailureKind, Policy, TaskRun, TaskState, WorkflowRun
from dagsched.sim.shift import shifted_start
from dagsched.sim.truth import HiddenTruth
from dagsched.sim.usage import UsageMeter

# Module-level aliases: a global lookup is several times cheaper than an enum class attribute.
_WAITING, _READY, _QUEUED, _RUNNING, _DONE, _CANCELLED = TaskState
_OOM, _TRANSIENT = FailureKind.OOM, FailureKind.TRANSIENT


class PolicyError(RuntimeError):
    """A policy broke the contract: dead node, missing or duplicate decision."""


_heappush, _heappop = heapq.heappush, heapq.heappop


class Simulator(FaultHandling):
    """Plays workflows on a cluster. Drive it with `run(policy)` or `advance()`/`apply()`."""

    def __init__(
        self,
        scenario: ScenarioConfig,
        workflows: Iterable[Workflow],
        *,
        seed: int = 0,
        on_outcome: OutcomeHook | None = None,
        keep_log: bool = False,
    ) -> None:
        streams = np.random.SeedSequence(seed).spawn(4)
        cluster_rng, self._fault_rng, task_rng, self._truth_rng = (
            np.random.default_rng(s) for s in streams
        )
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
        self.truth = HiddenTruth(scenario.truth, seed)  # only the engine reads it
        self.history = History()  # what has been measured: policies may read it
        self._credited_wf_s = 0.0  # workflow-seconds handed to decisions so far
        self._charged_wf_s = 0.0  # failed workflows' remaining time, for the next decision
        self._instant_s = -1.0  # the latest instant with decisions ...
        self._instant: list[TaskRun] = []  # ... its decisions so far ...
        self._pool = 0.0  # ... and the workflow-seconds they share
        self.now = 0.0
        self.on_outcome = on_outcome
        self.log: list[AttemptRecord] | None = [] if keep_log else None
        self.active: dict[str, WorkflowRun] = {}
        self._heap: list[tuple[float, int, int, Any, int]] = []
        self._seq = itertools.count()
        self._ready: list[TaskRun] = []
        self._stalled: list[TaskRun] = []  # ready while every node was down
        self._arrivals: Iterator[Workflow] = iter(workflows)
        self._arrivals_done = False
        self._last_arrival = 0.0
        self._up_since = [0.0] * self.cluster.n
        rate_s = scenario.faults.node_failure_per_hour / 3600.0
        self._fail_rate_s = [rate_s] * self.cluster.n  # per node: a drift raises some
        self._fault_token = [0] * self.cluster.n  # invalidates a node's pending crash on drift
        for node in range(self.cluster.n):
            self._schedule_crash(node)
        if scenario.drift is not None:
            self._push(scenario.drift.at_s, DRIFT, scenario.drift)
        self.drifted_at: float | None = None
        self._shift: ShiftConfig | None = None  # the shift in effect (hidden from policies)
        self._mem_spread = 1.0
        if scenario.shift is not None:
            self._push(scenario.shift.at_s, SHIFT, scenario.shift)
        self.shifted_at: float | None = None
        self._next_arrival()

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
        hook, log = self.on_outcome, self.log
        self.on_outcome, self.log = None, None
        try:
            clone = copy.deepcopy(self, memo)
        finally:
            self.on_outcome, self.log = hook, log
        # deepcopy keeps a bound builtin method as is: rebind to the copy's own generator, or
        # the fork's rollouts would consume the real run's draws
        clone._u = clone._random.random
        return clone, memo

    def summary(self) -> dict[str, Any]:
        """Metrics so far, plus the measured node failure rate."""
        out = self.metrics.summary(self.usage.shares())
        up = self.metrics.node_up_s + sum(
            self.now - since
            for since, ok in zip(self._up_since, self.cluster.alive, strict=True)
            if ok
        )
        out["node_hours"] = up / 3600.0
        out["sim_time_s"] = self.now
        return out

    # -- events -------------------------------------------------------------------------------

    def _push(self, at: float, kind: int, obj: Any, token: int = 0) -> None:
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
            if token == self._fault_token[obj]:
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
        ratios = self.truth.draw(wf, self._truth_rng, self._mem_spread).tolist()
        for t, (cpu, mem, rt) in zip(run.tasks, ratios, strict=True):
            t.use_cores = t.spec.cpu_cores * cpu
            t.peak_mem = t.spec.mem_gb * mem
            t.true_s = t.spec.duration_s * rt
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
        t, node, cpu, mem, retries = d
        c = self.cluster
        if t.state != _READY:
            raise PolicyError(f"decision for {t.key}, which is {t.state.name}, not READY")
        if not (0 <= node < c.n) or not c.alive[node]:
            raise PolicyError(f"decision for {t.key} picks dead or unknown node {node}")
        t.node = node
        t.cpu, t.mem, t.max_retries = cpu, mem, _ = clamp_placement(cpu, mem, retries)
        t.res_cores = res_cores = cpu * c.cores_list[node]
        t.res_mem = res_mem = mem * c.mem_list[node]
        old = 1.0 - c.free_cores[node] / c.cores_list[node]
        t.decided_jain = jain_with(c._sum_x, c._sum_x2, c.n, old, old + cpu)
        self._credit(t)
        m = self.metrics
        m.decisions += 1
        if t.prev_node >= 0 and t.prev_node != node:
            m.migrations += 1
        if c.fits(node, res_cores, res_mem):
            self._start(t)  # backfill: it fits now, whatever waits in the queue
        else:
            t.state = _QUEUED
            c.queues[node].append(t)
            c.queue_len[node] += 1
            c.queued_core_s[node] += self._est_core_s(t)

    def _est_core_s(self, t: TaskRun) -> float:
        return t.res_cores * t.spec.duration_s / self.cluster.speed_rows[t.node][t.spec.type]

    def _start(self, t: TaskRun) -> None:
        c, node, now, spec = self.cluster, t.node, self.now, t.spec
        c.reserve(node, t.res_cores, t.res_mem)
        self._hold(t, 1.0)
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
        throttle = spec.cpu_cores / t.res_cores
        advertised = spec.duration_s / speed
        t.advertised_s = advertised * throttle if throttle > 1 else advertised
        # ...and what really happens: CPU reserved below real use runs proportionally slower
        throttle = t.use_cores / t.res_cores
        actual = t.true_s / speed * c.slowdown[node]
        t.compute_s = actual * throttle if throttle > 1 else actual
        t.compute_start_s = now + xfer + spec.cold_start_s
        if self._shift is not None:
            own = t.use_cores if t.use_cores < t.res_cores else t.res_cores
            shifted_start(self._shift, t, self.node_use[node][0] - own, c.cores_list[node])
        if t.res_mem < t.peak_mem:  # memory grows with progress until it crosses the limit
            at = t.compute_start_s + t.compute_s * t.res_mem / t.peak_mem
            self._push(at, FAIL, (t, _OOM), t.token)
        elif self._u() < c.transient_failure[node]:
            at = t.compute_start_s + t.compute_s * self._u()
            self._push(at, FAIL, (t, _TRANSIENT), t.token)
        else:
            self._push(t.compute_start_s + t.compute_s, FINISH, t, t.token)

    def _drain(self, node: int) -> None:
        """Start every queued attempt that fits now, in queue order (first fit: a blocked
        head does not hold back smaller attempts behind it)."""
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
            waiting = [t for t in q if t.state == _QUEUED]
            q.clear()
            q.extend(waiting)

    # -- finishes (failures are in sim.faults) ------------------------------------------------

    def _finish(self, t: TaskRun) -> None:
        # the node's measured slowdown moves towards this task's observed / advertised time
        seen, node = self.cluster.observed_slowdown, t.node
        ratio = (self.now - t.compute_start_s) / t.advertised_s
        seen[node] += SLOWDOWN_WEIGHT * (ratio - seen[node])
        self._outcome(t, failed=False)
        used, peak, computed = self._end_attempt(t, "done")
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
