"""`heft_history` on the views every scheduler reads: HEFT on predicted run times, with the
VPA recommender's reservations from per-family history and a priority rule for node queues.

The same arithmetic is the served network's base (`policy.model`): its node logits are
`base_logits` of the observation's `log_pred_finish_s` feature plus a learned residual, its
reservations and priority `heft_history`'s plus a learned residual, and it places a batch in
`heft_order`. A residual of zero decides exactly as this module does, task by task.

- Order: highest upward rank first (HEFT), stable.
- Node: the candidate with the earliest estimated finish (`core.demand.finish_s`); among
  estimates within `core.ties.TIE_TOL` of each other in `base_logits`, the lowest index.
- Reservations: the request history recommends (`core.demand.recommended_request`), as
  fractions of the chosen node; `HEFT_RETRIES` retries.
- Priority (`PRIORITY_RULES`): how the node's queue orders this attempt among those waiting.
  `fifo` gives every attempt 0 (queue order alone); `srpt` favours the workflow with the
  least declared work left (shortest remaining processing time: Decima's SJF-CP
  heuristic, Mao et al. SIGCOMM 2019, and the classic result that SRPT minimises mean
  completion time on one machine); `edf` the earliest deadline; `slack` the least slack
  (deadline minus the declared critical path still ahead, Liu and Layland's least-laxity).

Runtime predictions follow Tsafrir, Etsion and Feitelson (IEEE TPDS 2007); reservations the
Kubernetes VPA recommender (p90 of decaying histograms, +15%).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from dagsched.core.demand import (
    HEFT_RETRIES,
    WorkLeft,
    candidates,
    demand_fractions,
    finish_s,
    fits_now,
    predicted_compute_s,
    recommended_request,
    srpt_priority,
)
from dagsched.core.history import predicted_use
from dagsched.core.observation import finish_logits, transfer_estimate_s
from dagsched.core.scheduler import Placement
from dagsched.core.ties import best_node
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import upward_rank

_MASKED = np.float32(-1e9)


def base_logits(log_finish: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Node logits of `heft_history` from float32 `log1p(finish_s)` values, masked as the
    model masks: float32 values (the model's base is exactly these), held in float64 as every
    served path compares them (`core.ties.best_node`)."""
    return np.where(mask, finish_logits(log_finish), _MASKED).astype(np.float32).astype(np.float64)


def heft_order(tasks: Sequence[TaskView]) -> list[int]:
    """Indices of `tasks` by HEFT's order: highest upward rank first, stable."""
    ranks: dict[int, list[float]] = {}

    def rank(t: TaskView) -> float:
        key = id(t.workflow)
        if key not in ranks:
            ranks[key] = upward_rank(t.workflow)
        return ranks[key][t.idx]

    return sorted(range(len(tasks)), key=lambda i: -rank(tasks[i]))


def _fifo(task: TaskView, work: WorkLeft) -> float:
    return 0.0


def _srpt(task: TaskView, work: WorkLeft) -> float:
    return srpt_priority(work.core_s(task))


def _edf(task: TaskView, work: WorkLeft) -> float:
    wf = task.workflow
    return -(wf.arrival_s + wf.deadline_s)  # earlier deadline, higher


def _slack(task: TaskView, work: WorkLeft) -> float:
    # the latest start that still meets the sub-deadline: earlier means less slack at any time
    wf = task.workflow
    return -(task.sub_deadline_s - wf.tasks[task.idx].duration_s)


PRIORITY_RULES: dict[str, Callable[[TaskView, WorkLeft], float]] = {
    "fifo": _fifo,
    "srpt": _srpt,
    "edf": _edf,
    "slack": _slack,
}


class HeftHistory:
    """`heft_history` as a `Scheduler`: the same decisions in the simulator and the daemon."""

    def __init__(self, priority: str = "fifo") -> None:
        if priority not in PRIORITY_RULES:
            raise ValueError(f"unknown priority rule {priority!r}; choose from {PRIORITY_RULES}")
        self.rule = priority
        self._priority = PRIORITY_RULES[priority]
        self.version = "heft_history" if priority == "fifo" else f"heft_history_{priority}"

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        view = cluster.batch_copy()
        alive = view.alive.astype(bool)
        inv_c = 1.0 / view.cores
        first_wait = view.first_wait_s()
        work = WorkLeft()
        out: list[Placement | None] = [None] * len(tasks)
        for i in heft_order(tasks):
            t = tasks[i]
            spec = t.workflow.tasks[t.idx]
            _, _, ratio = predicted_use(spec.cpu_cores, spec.mem_gb, t.history)
            rec_cores, rec_mem = recommended_request(spec.cpu_cores, spec.mem_gb, t.history)
            cpu_f, mem_f = demand_fractions(view, rec_cores, rec_mem)
            res_c, res_m = cpu_f * view.cores, mem_f * view.mem_gb
            speed = view.speed[:, int(spec.type)]
            compute = predicted_compute_s(
                spec.duration_s, ratio, speed, spec.cpu_cores, res_c, view.slowdown
            )
            fits = fits_now(view, res_c, res_m)
            eft = finish_s(
                view.queued_core_s * inv_c, fits, first_wait, transfer_estimate_s(view, t), compute
            )
            mask = candidates(view, alive, rec_mem)
            node = best_node(base_logits(np.log1p(eft).astype(np.float32), mask))
            # float32, as the served network holds them: the same reservations, bit for bit
            cpu, mem = float(np.float32(cpu_f[node])), float(np.float32(mem_f[node]))
            out[i] = Placement(node, cpu, mem, HEFT_RETRIES, 0.0, self._priority(t, work))
            view.take(t, node, cpu, mem)
        return [p for p in out if p is not None]
