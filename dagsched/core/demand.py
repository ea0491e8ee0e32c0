"""What a task asks of each node, and when it would finish there: the arithmetic
`heft_history` decides by, shared by the observation (its `pred` features are exactly these
numbers) and the served network's base, so both read one definition.

- The request: what history recommends (`recommended_request`: the VPA recommender's p90
  x 1.15, memory at least 1.2 x the highest limit an OOM kill of the family hit), as
  fractions of every node (`demand_fractions`, clamped to the reservation bounds).
- Candidates: alive nodes whose largest memory reservation holds the recommended memory.
- The priority (`srpt_priority`): the less declared work the task's workflow has left, the
  sooner it runs from a node's queue.
- The estimated finish (`finish_s`): queued work per core, plus the wait for the node's
  first running attempt to end when the task does not fit now, plus the slowest input
  transfer, plus the predicted compute time (declared x history's runtime ratio, at the
  node's advertised speed x its measured slowdown, slower in proportion where the CPU
  reserved is below the declared).

Every expression is written once here and evaluated in float64 in a fixed order: the
vectorised observation and the compiled serving loop repeat them operation for operation,
and the exactness tests compare their results bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS, PRIORITY_BOUNDS
from dagsched.core.history import VPA_MARGIN, FamilySummary, predicted_use
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import Workflow


def demand_fractions(
    cluster: ClusterView, cpu_cores: float, mem_gb: float
) -> tuple[np.ndarray, np.ndarray]:
    """The task's demand as reservation fractions of every node, clamped to the bounds."""
    cpu = np.clip(cpu_cores / cluster.cores, *CPU_BOUNDS)
    mem = np.clip(mem_gb / cluster.mem_gb, *MEM_BOUNDS)
    return cpu, mem


def recommended_request(
    cpu_cores: float, mem_gb: float, h: FamilySummary | None
) -> tuple[float, float]:
    """(cores, memory GB) history recommends reserving: the prediction with the VPA
    recommender's margin (`predicted_use` at `VPA_MARGIN`: p90 x 1.15, memory at least 1.2 x
    the highest limit an OOM kill of the family hit), what `heft_history` reserves. The
    continuous head is centred on it, so an untrained head serves that recommendation."""
    cores, mem, _ = predicted_use(cpu_cores, mem_gb, h, VPA_MARGIN)
    return cores, mem


def candidates(cluster: ClusterView, alive: np.ndarray, mem_gb: float | np.ndarray) -> np.ndarray:
    """The nodes a policy may choose for tasks recommended `mem_gb` ([..., 1] or a scalar):
    alive nodes whose largest memory reservation (the upper bound) holds it, as
    `heft_history`'s candidates; every alive node for a task no node can hold. Elsewhere a
    task is OOM-killed for sure, and in a world where a kill costs an hour's restart one
    such choice per family starts a spiral of retries."""
    holds = alive & (cluster.mem_gb * MEM_BOUNDS[1] >= mem_gb - 1e-9)
    return np.where(holds.any(axis=-1, keepdims=True), holds, alive)


def fits_now(cluster: ClusterView, cores: np.ndarray, mem: np.ndarray) -> np.ndarray:
    """Nodes where a reservation of `cores` and `mem` would start now: it fits what is free
    (nodes backfill, so a queue in front does not hold it back)."""
    return (cluster.free_cores >= cores - 1e-9) & (cluster.free_mem >= mem - 1e-9)


def predicted_compute_s(
    duration_s: np.ndarray | float,
    runtime_ratio: np.ndarray | float,
    speed: np.ndarray,
    cpu_cores: np.ndarray | float,
    res_cores: np.ndarray,
    slowdown: np.ndarray,
) -> np.ndarray:
    """Compute seconds on each node: declared x predicted ratio at the advertised `speed`,
    x max(1, declared cores / reserved cores) (a CPU reservation below the request runs
    proportionally slower), x the node's measured slowdown."""
    return duration_s * runtime_ratio / speed * np.maximum(1.0, cpu_cores / res_cores) * slowdown


def finish_s(
    queued_per_core: np.ndarray,
    fits: np.ndarray,
    first_wait_s: np.ndarray,
    transfer_s: np.ndarray,
    compute_s: np.ndarray,
) -> np.ndarray:
    """Estimated seconds from now until the task would finish on each node (HEFT's earliest
    finish time, on what a deployment can know): ((queued work per core + the first running
    attempt's remaining time where it does not fit now) + input transfer) + compute."""
    return queued_per_core + np.where(fits, 0.0, first_wait_s) + transfer_s + compute_s


# node logits = -FINISH_BETA x log(1 + estimated finish seconds): a 5% later finish is one
# logit lower, the temperature of the base policy when actions are sampled
FINISH_BETA = np.float32(20.0)
# srpt: priority 1 - log10(1 + declared core-seconds left) / SRPT_DECADES, in [0, 1]
SRPT_DECADES = 8.0
HEFT_RETRIES = 3


def srpt_priority(remaining_core_s: float) -> float:
    """The priority of a workflow with this much declared work left (cores x seconds of its
    tasks not done): higher for less, in the priority bounds, rounded to float32 (so a
    float32 network that adds a zero residual to it answers exactly it)."""
    p = 1.0 - math.log10(1.0 + max(0.0, remaining_core_s)) / SRPT_DECADES
    lo, hi = PRIORITY_BOUNDS
    return float(np.float32(lo if p < lo else hi if p > hi else p))


def work_left_core_s(task: TaskView) -> float:
    """Cores x seconds, declared, of the tasks of `task`'s workflow that are not done."""
    work = np.array([t.cpu_cores * t.duration_s for t in task.workflow.tasks])
    return float(work @ ~task.done)


class WorkLeft:
    """Declared work left in a task's workflow; each workflow's per-task work vector is kept
    (a cache the caller owns: a batch, a scheduler)."""

    def __init__(self, max_workflows: int = 4096) -> None:
        self.max_workflows = max_workflows
        self._by_wf: dict[int, tuple[Workflow, np.ndarray]] = {}

    def core_s(self, task: TaskView) -> float:
        """Cores x seconds, declared, of the tasks of `task`'s workflow that are not done."""
        wf = task.workflow
        hit = self._by_wf.get(id(wf))
        if hit is None or hit[0] is not wf:
            if len(self._by_wf) >= self.max_workflows:
                self._by_wf.clear()
            work = np.array([t.cpu_cores * t.duration_s for t in wf.tasks])
            self._by_wf[id(wf)] = hit = (wf, work)
        return float(hit[1] @ ~task.done)
