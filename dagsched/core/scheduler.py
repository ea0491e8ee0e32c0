"""What every scheduler — the GNN, a heuristic fallback — offers the daemon and the simulator.

A `Scheduler` turns a `ClusterView` and a batch of `TaskView`s into one `Placement` each.
`sim.snapshot.SchedulerPolicy` runs any scheduler inside the simulator, so a model is
evaluated in simulation through exactly the code path the daemon serves it with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from dagsched.core.view import ClusterView, TaskView


@dataclass(frozen=True, slots=True)
class Placement:
    """Node index into the view, CPU and memory reservation fractions, max retries, the
    log-probability of this action under the policy that chose it (0 for heuristics), and the
    priority in the node's queue (higher first)."""

    node: int
    cpu: float
    mem: float
    max_retries: int
    log_prob: float = 0.0
    priority: float = 0.0


class Scheduler(Protocol):
    """Places batches of ready tasks; `version` names the model (or heuristic) for audit."""

    version: str

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        """One placement per task, in the order given; never a dead node."""
        ...
