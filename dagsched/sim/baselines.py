"""Heuristic baselines. Each reserves its task's demand, clamped to the reservation bounds.

All but `random` and `round_robin` skip nodes where the clamped memory reservation would be
below the task's demand (an OOM in waiting) while any other node is alive, the way a
Kubernetes filter drops nodes whose allocatable memory is below the request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from dagsched.sim.state import CPU_BOUNDS, MEM_BOUNDS, Decision, Policy, TaskRun, TaskState

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator

DEFAULT_RETRIES = 3
CPU_LO, CPU_HI = CPU_BOUNDS
MEM_LO, MEM_HI = MEM_BOUNDS


class BatchView:
    """A snapshot of the nodes, updated as a policy places a batch, so later tasks of the
    same batch see the earlier placements. The cluster itself is never written."""

    __slots__ = ("alive", "free_cores", "free_mem", "queue_len", "queued_core_s")

    def __init__(self, sim: Simulator) -> None:
        snap = sim.cluster.snapshot()
        self.alive = snap.alive
        self.free_cores = snap.free_cores
        self.free_mem = snap.free_mem
        self.queue_len = snap.queue_len
        self.queued_core_s = snap.queued_core_s

    def take(self, sim: Simulator, node: int, d: Demand, duration_s: float) -> None:
        """Record a placement on `node`: it runs now if it fits, else it queues."""
        if self.queue_len[node] == 0 and d.fits_on(self, node):
            self.free_cores[node] -= d.res_cores[node]
            self.free_mem[node] -= d.res_mem[node]
        else:
            self.queue_len[node] += 1
            self.queued_core_s[node] += d.res_cores[node] * duration_s

    def least_backlog(self, sim: Simulator, mask: np.ndarray) -> int:
        """Among `mask`, the node with the least queued and running work per core."""
        c = sim.cluster
        busy = (self.queued_core_s + c.cores - self.free_cores) * c.inv_cores
        return int(np.argmin(np.where(mask, busy, np.inf)))


class Demand:
    """One task's clamped reservation on every node, as vectors."""

    __slots__ = ("cpu", "mem", "mem_ok", "res_cores", "res_mem")

    def __init__(self, sim: Simulator, t: TaskRun) -> None:
        c = sim.cluster
        # np.minimum/np.maximum: np.clip's Python wrapper costs more than the math here
        self.cpu = np.minimum(np.maximum(c.inv_cores * t.spec.cpu_cores, CPU_LO), CPU_HI)
        self.mem = np.minimum(np.maximum(c.inv_mem * t.spec.mem_gb, MEM_LO), MEM_HI)
        self.res_cores = self.cpu * c.cores
        self.res_mem = self.mem * c.mem_gb
        self.mem_ok = self.res_mem >= t.spec.mem_gb - 1e-9

    def candidates(self, view: BatchView) -> np.ndarray:
        """Alive nodes that will not OOM, or all alive nodes when none qualifies."""
        ok = view.alive & self.mem_ok
        return ok if ok.any() else view.alive

    def fits_now(self, view: BatchView) -> np.ndarray:
        """Nodes where the reservation fits immediately (free resources and empty queue)."""
        return (
            (view.free_cores + 1e-9 >= self.res_cores)
            & (view.free_mem + 1e-9 >= self.res_mem)
            & (view.queue_len == 0)
        )

    def fits_on(self, view: BatchView, node: int) -> bool:
        return bool(
            view.free_cores[node] + 1e-9 >= self.res_cores[node]
            and view.free_mem[node] + 1e-9 >= self.res_mem[node]
        )

    def decision(self, t: TaskRun, node: int) -> Decision:
        return Decision(t, node, float(self.cpu[node]), float(self.mem[node]), DEFAULT_RETRIES)


Chooser = Callable[["Simulator", BatchView, Demand, TaskRun], int]


def place_in_order(sim: Simulator, order: list[TaskRun], choose: Chooser) -> list[Decision]:
    """Decide tasks one by one in `order`, each seeing the batch's earlier placements."""
    view = BatchView(sim)
    out = []
    for t in order:
        d = Demand(sim, t)
        node = choose(sim, view, d, t)
        out.append(d.decision(t, node))
        view.take(sim, node, d, t.spec.duration_s)
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
    """Kubernetes-style LeastAllocated + BalancedAllocation over nodes the task fits on."""
    c = sim.cluster
    cand = d.candidates(view)
    fit = cand & d.fits_now(view)
    if not fit.any():
        return view.least_backlog(sim, cand)
    cpu_left = view.free_cores * c.inv_cores - d.cpu
    mem_left = view.free_mem * c.inv_mem - d.mem
    score = (cpu_left + mem_left) * 0.5 - np.abs(cpu_left - mem_left)  # + 1, constant
    return int(np.argmax(np.where(fit, score, -np.inf)))


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
        c = sim.cluster
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
                    align = (d.res_cores / c.cores) * (view.free_cores / c.cores) + (
                        d.res_mem / c.mem_gb
                    ) * (view.free_mem / c.mem_gb)
                    node = int(np.argmax(np.where(fit, align, -np.inf)))
                    score = float(align[node])
                score += self.remaining_weight * (1 - left[t.run.wf.id] / most)
                if best is None or score > best[0]:
                    best = (score, i, node, d)
            assert best is not None
            _, i, node, d = best
            t = todo.pop(i)
            out.append(d.decision(t, node))
            view.take(sim, node, d, t.spec.duration_s)
        return out


class HEFTPolicy:
    """HEFT: highest upward rank first, each on the node with the earliest estimated finish
    (queue wait + input transfers from its parents' nodes + compute at that node's speed)."""

    name = "heft"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        order = sorted(ready, key=lambda t: -t.run.upward_rank()[t.idx])
        return place_in_order(sim, order, earliest_finish_node)


def earliest_finish_node(sim: Simulator, view: BatchView, d: Demand, t: TaskRun) -> int:
    """The candidate node with the earliest estimated finish time for the task."""
    c, now = sim.cluster, sim.now
    cand = d.candidates(view)
    fit = d.fits_now(view)
    wait = view.queued_core_s / c.cores
    for node in np.flatnonzero(cand & ~fit):
        ends = [r.compute_start_s + r.compute_s for r in c.running[node]]
        wait[node] += (min(ends) - now) if ends else 0.0
    xfer = np.zeros(c.n)
    for p in t.run.wf.parents[t.idx]:
        parent = t.run.tasks[p]
        xfer = np.maximum(xfer, c.network.transfer_s_to_all(parent.node, parent.spec.output_bytes))
    slow = np.maximum(1.0, t.spec.cpu_cores / d.res_cores)
    compute = t.spec.duration_s / c.speed[:, t.spec.type] * slow
    eft = wait + xfer + compute
    return int(np.argmin(np.where(cand, eft, np.inf)))


def _remaining_work(t: TaskRun) -> float:
    return sum(
        x.spec.duration_s * x.spec.cpu_cores for x in t.run.tasks if x.state != TaskState.DONE
    )


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
    }
    if name not in table:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(table)}")
    return table[name]()
