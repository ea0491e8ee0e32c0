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

import math
from collections.abc import Callable, Sequence

import numpy as np

from dagsched.core.bounds import PRIORITY_BOUNDS
from dagsched.core.demand import (
    candidates,
    demand_fractions,
    finish_s,
    fits_now,
    predicted_compute_s,
    recommended_request,
)
from dagsched.core.history import predicted_use
from dagsched.core.observation import transfer_estimate_s
from dagsched.core.scheduler import Placement
from dagsched.core.ties import best_node
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import Workflow, upward_rank

HEFT_RETRIES = 3
# logits = -FINISH_BETA x log(1 + estimated finish seconds): a 5% later finish is one logit
# lower, the temperature of the base policy when actions are sampled
FINISH_BETA = np.float32(20.0)
_MASKED = np.float32(-1e9)
# srpt: priority 1 - log10(1 + declared core-seconds left) / SRPT_DECADES, in [0, 1]
SRPT_DECADES = 8.0


def base_logits(log_finish: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Node logits of `heft_history` from float32 `log1p(finish_s)` values: float32, masked
    as the model masks (its base is exactly this)."""
    z = np.float32(-FINISH_BETA) * log_finish.astype(np.float32)
    return np.where(mask, z, _MASKED).astype(np.float32)


def heft_order(tasks: Sequence[TaskView]) -> list[int]:
    """Indices of `tasks` by HEFT's order: highest upward rank first, stable."""
    ranks: dict[int, list[float]] = {}

    def rank(t: TaskView) -> float:
        key = id(t.workflow)
        if key not in ranks:
            ranks[key] = upward_rank(t.workflow)
        return ranks[key][t.idx]

    return sorted(range(len(tasks)), key=lambda i: -rank(tasks[i]))


class _Work:
    """Per workflow, each task's declared work (cores x seconds), kept for a batch."""

    def __init__(self) -> None:
        self._by_wf: dict[int, tuple[Workflow, np.ndarray]] = {}

    def of(self, wf: Workflow) -> np.ndarray:
        hit = self._by_wf.get(id(wf))
        if hit is None or hit[0] is not wf:
            work = np.array([t.cpu_cores * t.duration_s for t in wf.tasks])
            self._by_wf[id(wf)] = hit = (wf, work)
        return hit[1]


def srpt_priority(remaining_core_s: float) -> float:
    """`srpt`'s priority of a workflow with this much declared work left: higher for less."""
    p = 1.0 - math.log10(1.0 + max(0.0, remaining_core_s)) / SRPT_DECADES
    lo, hi = PRIORITY_BOUNDS
    return lo if p < lo else hi if p > hi else p


def _fifo(task: TaskView, work: _Work) -> float:
    return 0.0


def _srpt(task: TaskView, work: _Work) -> float:
    left = float(work.of(task.workflow) @ ~task.done)
    return srpt_priority(left)


def _edf(task: TaskView, work: _Work) -> float:
    wf = task.workflow
    return -(wf.arrival_s + wf.deadline_s)  # earlier deadline, higher


def _slack(task: TaskView, work: _Work) -> float:
    # the latest start that still meets the sub-deadline: earlier means less slack at any time
    wf = task.workflow
    return -(task.sub_deadline_s - wf.tasks[task.idx].duration_s)


PRIORITY_RULES: dict[str, Callable[[TaskView, _Work], float]] = {
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
        work = _Work()
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
            cpu, mem = float(cpu_f[node]), float(mem_f[node])
            out[i] = Placement(node, cpu, mem, HEFT_RETRIES, 0.0, self._priority(t, work))
            view.take(t, node, cpu, mem)
        return [p for p in out if p is not None]
