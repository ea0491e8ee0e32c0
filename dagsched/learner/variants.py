"""Scheduler variants for judging studies, built on the public `Scheduler` interface only.

`ShiftedReservation` moves one reservation of any scheduler's placements in logit space of
its bounds, as moving the policy's continuous head's mean logit would (the residual head's
mean is `sigmoid(logit(anchor) + shift)`), without reaching into the model.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.core.scheduler import Placement, Scheduler
from dagsched.core.view import ClusterView, TaskView

_BOUNDS = {"cpu": CPU_BOUNDS, "mem": MEM_BOUNDS}


def shift_logit(x: float, lo: float, hi: float, shift: float) -> float:
    """`x` in [lo, hi] moved by `shift` in the logit of its position in the range."""
    u = min(max((x - lo) / (hi - lo), 1e-4), 1 - 1e-4)
    z = math.log(u) - math.log1p(-u) + shift
    return lo + (hi - lo) / (1.0 + math.exp(-z))


class ShiftedReservation:
    """`base`'s placements with the `head` ("cpu" or "mem") reservation shifted by `shift`."""

    def __init__(self, base: Scheduler, head: str, shift: float, version: str) -> None:
        if head not in _BOUNDS:
            raise ValueError(f"head must be one of {sorted(_BOUNDS)}, got {head!r}")
        self.base = base
        self.head = head
        self.shift = shift
        self.version = version

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        lo, hi = _BOUNDS[self.head]
        out = []
        for p in self.base.place(cluster, tasks):
            moved = shift_logit(getattr(p, self.head), lo, hi, self.shift)
            out.append(replace(p, cpu=moved) if self.head == "cpu" else replace(p, mem=moved))
        return out
