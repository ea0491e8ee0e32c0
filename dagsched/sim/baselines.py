"""Heuristic baselines. Each reserves its task's declared request, clamped to the
reservation bounds - except `heft_history` (`core.heft`, run here through the views every
scheduler reads), which reserves what history recommends and orders node queues by its
priority rule.

All but `random` and `round_robin` skip nodes where the clamped memory reservation would be
below the planned amount (an OOM in waiting) while any other node is alive, the way a
Kubernetes filter drops nodes whose allocatable memory is below the request.

Baselines read only what the daemon could know too: node shapes, reservations and queues,
declared task specs, when running attempts started, the nodes' measured slowdown and the
per-family `History` of measured outcomes - never the hidden truth or the true network.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.core.estimates import transfer_to_all_s
from dagsched.core.heft import HeftHistory
from dagsched.sim.runs import Decision, Policy, TaskRun, TaskState
from dagsched.sim.snapshot import SchedulerPolicy

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator

DEFAULT_RETRIES = 3
_FRAC_LO = np.array(((CPU_BOUNDS[0],), (MEM_BOUNDS[0],)))
_FRAC_HI = np.array(((CPU_BOUNDS[1],), (MEM_BOUNDS[1],)))
_EPS = 1e-9  # float slack on "fits", as a fraction of the node


class BatchView:
    """A snapshot of the nodes, updated as a policy places a batch, so later tasks of the
    same batch see the earlier placements. The cluster itself is never written.

    Free resources are kept as fractions of each node's capacity, stacked as `free[0]`
    (cores) and `free[1]` (memory): on small clusters numpy's per-call cost dominates, so
    the hot scoring path works on one [2, n] array instead of two vectors.
    """

    __slots__ = ("alive", "free", "open", "queue_len", "queued_core_s")

    def __init__(self, sim: Simulator) -> None:
        c = sim.cluster
        self.alive = np.array(c.alive, dtype=bool)
        self.free = np.array((c.free_cores, c.free_mem)) * c.inv_shape
        self.queue_len = np.array(c.queue_len, dtype=np.int64)
        self.queued_core_s = np.array(c.queued_core_s)
        self.open = self.alive.copy()  # a fitting task would start now (nodes backfill)

    def take(self, sim: Simulator, node: int, d: Demand, t: TaskRun) -> None:
        """Record a placement on `node`: it runs now if it fits (even behind a queue: nodes
        backfill), else it queues (its declared work at the node's advertised speed, as the
        cluster's queue accounting has it)."""
        if self.open[node] and d.fits_on(self, node):
            self.free[:, node] -= d.frac[:, node]
        else:
            self.queue_len[node] += 1
            c, spec = sim.cluster, t.spec
            work = d.frac[0, node] * c.cores_list[node] * spec.duration_s
            self.queued_core_s[node] += work / c.speed_rows[node][spec.type]

    def least_backlog(self, sim: Simulator, mask: np.ndarray) -> int:
        """Among `mask`, the node with the least queued and running work per core."""
        busy = self.queued_core_s * sim.cluster.inv_cores - self.free[0]  # + 1, constant
        return int(np.argmin(np.where(mask, busy, np.inf)))


class Demand:
    """One task's clamped reservation on every node, as fractions `frac` ([2, n]: cores,
    memory) of each node's capacity."""

    __slots__ = ("frac", "mem_ok", "runtime_ratio", "shape")

    def __init__(
        self,
        sim: Simulator,
        t: TaskRun,
        cores: float | None = None,
        mem_gb: float | None = None,
        runtime_ratio: float = 1.0,
    ) -> None:
        """The declared request, or `cores` and `mem_gb` when given (a prediction), whose
        run time is `runtime_ratio` x the declared one."""
        c = sim.cluster
        spec = t.spec
        want = (
            (spec.cpu_cores if cores is None else cores,),
            (spec.mem_gb if mem_gb is None else mem_gb,),
        )
        frac = c.inv_shape * np.array(want)
        self.runtime_ratio = runtime_ratio
        # the memory reservation covers the demand unless the upper bound clips it
        self.mem_ok = frac[1] <= _FRAC_HI[1, 0] + _EPS
        # in place: np.clip's Python wrapper costs more than the math here
        np.maximum(frac, _FRAC_LO, out=frac)
        np.minimum(frac, _FRAC_HI, out=frac)
        self.frac = frac
        self.shape = c.shape

    @property
    def cpu(self) -> np.ndarray:
        return self.frac[0]

    @property
    def mem(self) -> np.ndarray:
        return self.frac[1]

    @property
    def res_cores(self) -> np.ndarray:
        return self.frac[0] * self.shape[0]

    @property
    def res_mem(self) -> np.ndarray:
        return self.frac[1] * self.shape[1]

    def candidates(self, view: BatchView) -> np.ndarray:
        """Alive nodes that will not OOM, or all alive nodes when none qualifies."""
        ok = view.alive & self.mem_ok
        return ok if ok.any() else view.alive

    def fits_now(self, view: BatchView) -> np.ndarray:
        """Nodes where the reservation fits immediately in their free resources."""
        left = view.free - self.frac
        return (left[0] >= -_EPS) & (left[1] >= -_EPS) & view.open

    def fits_on(self, view: BatchView, node: int) -> bool:
        return bool(
            view.free[0, node] - self.frac[0, node] >= -_EPS
            and view.free[1, node] - self.frac[1, node] >= -_EPS
        )

    def decision(self, t: TaskRun, node: int) -> Decision:
        return Decision(
            t, node, float(self.frac[0, node]), float(self.frac[1, node]), DEFAULT_RETRIES
        )


Chooser = Callable[["Simulator", BatchView, Demand, TaskRun], int]


def place_in_order(sim: Simulator, order: list[TaskRun], choose: Chooser) -> list[Decision]:
    """Decide tasks one by one in `order`, each seeing the batch's earlier placements."""
    view = BatchView(sim)
    out = []
    for t in order:
        d = Demand(sim, t)
        node = choose(sim, view, d, t)
        out.append(d.decision(t, node))
        view.take(sim, node, d, t)
    return out


class RandomPolicy:
    """Uniformly random alive node."""

    name = "random"

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        alive = np.flatnonzero(sim.cluster.alive)
        out = []
        for t in ready:
            node = int(alive[self.rng.integers(len(alive))])
            out.append(Demand(sim, t).decision(t, node))
        return out


class RoundRobinPolicy:
    """Cycle through the nodes, skipping dead ones."""

    name = "round_robin"

    def __init__(self) -> None:
        self.next = 0

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        c = sim.cluster
        out = []
        for t in ready:
            while not c.alive[self.next % c.n]:
                self.next += 1
            node = self.next % c.n
            self.next += 1
            out.append(Demand(sim, t).decision(t, node))
        return out


class FirstFitPolicy:
    """FIFO order; the lowest-numbered node it fits on now, else the least backlogged."""

    name = "first_fit"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        return place_in_order(sim, sorted(ready, key=lambda t: t.ready_s), first_fit_node)


def first_fit_node(sim: Simulator, view: BatchView, d: Demand, t: TaskRun) -> int:
    """The lowest-numbered candidate node the task fits on now."""
    cand = d.candidates(view)
    fit = np.flatnonzero(cand & d.fits_now(view))
    return int(fit[0]) if len(fit) else view.least_backlog(sim, cand)


def least_loaded_node(sim: Simulator, view: BatchView, d: Demand, t: TaskRun) -> int:
    """Kubernetes-style LeastAllocated + BalancedAllocation over nodes the task fits on.

    With c and m the CPU and memory fractions a node would have left, the score
    (c + m) / 2 - |c - m| equals 1.5 min(c, m) - 0.5 max(c, m): fewer numpy calls.
    """
    left = view.free - d.frac
    low = left.min(0)
    fit = (low >= -_EPS) & view.open
    fit_ok = fit & d.mem_ok  # the common case: a node where it fits and will not OOM
    if not fit_ok.any():
        cand = d.candidates(view)
        fit &= cand
        if not fit.any():
            return view.least_backlog(sim, cand)
        fit_ok = fit
    score = 3.0 * low - left.max(0)
    score[~fit_ok] = -np.inf
    return int(score.argmax())


class LeastLoadedPolicy:
    """Place each task on the node with the most free, best balanced resources."""

    name = "least_loaded"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        return place_in_order(sim, ready, least_loaded_node)


class SJFPolicy:
    """Shortest job first within the batch; least-loaded placement."""

    name = "sjf"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        order = sorted(ready, key=lambda t: (t.spec.duration_s, t.ready_s))
        return place_in_order(sim, order, least_loaded_node)


class TetrisPolicy:
    """Tetris: pick the (task, node) pair with the best alignment of demand with free
    resources, plus a bonus for tasks whose workflow has little work left."""

    name = "tetris"
    remaining_weight = 0.5

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        left = {t.run.wf.id: _remaining_work(t) for t in ready}
        most = max(left.values()) or 1.0
        todo = list(ready)
        view = BatchView(sim)
        out: list[Decision] = []
        while todo:
            best: tuple[float, int, int, Demand] | None = None
            for i, t in enumerate(todo):
                d = Demand(sim, t)
                cand = d.candidates(view)
                fit = cand & d.fits_now(view)
                if not fit.any():
                    score, node = -1.0, view.least_backlog(sim, cand)
                else:
                    align = d.frac[0] * view.free[0] + d.frac[1] * view.free[1]
                    node = int(np.argmax(np.where(fit, align, -np.inf)))
                    score = float(align[node])
                score += self.remaining_weight * (1 - left[t.run.wf.id] / most)
                if best is None or score > best[0]:
                    best = (score, i, node, d)
            assert best is not None
            _, i, node, d = best
            t = todo.pop(i)
            out.append(d.decision(t, node))
            view.take(sim, node, d, t)
        return out


class HEFTPolicy:
    """HEFT on declared values: highest upward rank first, each on the node with the
    earliest estimated finish (queue wait + estimated input transfers from its parents'
    nodes + declared compute at that node's advertised speed x its measured slowdown)."""

    name = "heft"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        order = sorted(ready, key=lambda t: -t.run.upward_rank()[t.idx])
        return place_in_order(sim, order, earliest_finish_node)


def _running_end_s(sim: Simulator, r: TaskRun) -> float:
    """When a running attempt is expected to end: its start, cold start and declared compute
    time at its node's advertised speed and measured slowdown."""
    return r.start_s + r.spec.cold_start_s + r.advertised_s * sim.cluster.observed_slowdown[r.node]


def earliest_finish_node(sim: Simulator, view: BatchView, d: Demand, t: TaskRun) -> int:
    """The candidate node with the earliest estimated finish time for the task, on declared
    values (`heft`; `heft_history`, on predicted ones, is `core.heft`)."""
    c, now = sim.cluster, sim.now
    cand = d.candidates(view)
    fit = d.fits_now(view)
    wait = view.queued_core_s / c.cores
    for node in np.flatnonzero(cand & ~fit):
        ends = [_running_end_s(sim, r) for r in c.running[node]]
        if ends:
            first = min(ends) - now
            wait[node] += first if first > 0 else 0.0
    xfer = np.zeros(c.n)
    zone, nic = c.zone, c.net_gbps
    for p in t.run.wf.parents[t.idx]:
        parent = t.run.tasks[p]
        xfer = np.maximum(xfer, transfer_to_all_s(zone, nic, parent.node, parent.spec.output_bytes))
    slow = np.maximum(1.0, t.spec.cpu_cores / d.res_cores)
    seen = np.asarray(c.observed_slowdown)
    compute = t.spec.duration_s * d.runtime_ratio / c.speed[:, t.spec.type] * slow * seen
    eft = wait + xfer + compute
    return int(np.argmin(np.where(cand, eft, np.inf)))


def _remaining_work(t: TaskRun) -> float:
    return sum(
        x.spec.duration_s * x.spec.cpu_cores for x in t.run.tasks if x.state != TaskState.DONE
    )


# heft_history with each priority rule of `core.heft`: FIFO node queues (the plain rule) and
# the three orderings measured for the ordering lever
HEFT_HISTORY_RULES = {
    "heft_history": "fifo",
    "heft_history_srpt": "srpt",
    "heft_history_edf": "edf",
    "heft_history_slack": "slack",
}


def _heft_history(rule: str) -> Callable[[], Policy]:
    return lambda: SchedulerPolicy(HeftHistory(rule))


def make_baseline(name: str, rng: np.random.Generator) -> Policy:
    """A fresh baseline policy by name."""
    table: dict[str, Callable[[], Policy]] = {
        "random": lambda: RandomPolicy(rng),
        "round_robin": RoundRobinPolicy,
        "first_fit": FirstFitPolicy,
        "least_loaded": LeastLoadedPolicy,
        "sjf": SJFPolicy,
        "tetris": TetrisPolicy,
        "heft": HEFTPolicy,
        **{name: _heft_history(rule) for name, rule in HEFT_HISTORY_RULES.items()},
    }
    if name not in table:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(table)}")
    return table[name]()
