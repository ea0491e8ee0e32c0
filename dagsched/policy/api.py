"""What every scheduler — the GNN, a heuristic fallback — offers the daemon and the simulator.

A `Scheduler` turns a `ClusterView` and a batch of `TaskView`s into one `Placement` each.
`SchedulerPolicy` adapts any scheduler to the simulator's `Policy` protocol, so a model is
evaluated in simulation through exactly the code path the daemon serves it with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from dagsched.sim.state import Decision, TaskRun
from dagsched.sim.view import ClusterView, TaskView, cluster_view, task_view

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


@dataclass(frozen=True, slots=True)
class Placement:
    """Node index into the view, CPU and memory reservation fractions, max retries, and the
    log-probability of this action under the policy that chose it (0 for heuristics)."""

    node: int
    cpu: float
    mem: float
    max_retries: int
    log_prob: float = 0.0


class Scheduler(Protocol):
    """Places batches of ready tasks; `version` names the model (or heuristic) for audit."""

    version: str

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        """One placement per task, in the order given; never a dead node."""
        ...


class SchedulerPolicy:
    """Run a `Scheduler` inside the simulator."""

    def __init__(self, scheduler: Scheduler, name: str | None = None) -> None:
        self.scheduler = scheduler
        self.name = name or scheduler.version

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        placements = self.scheduler.place(cluster_view(sim), [task_view(t, sim) for t in ready])
        return [
            Decision(t, p.node, p.cpu, p.mem, p.max_retries)
            for t, p in zip(ready, placements, strict=True)
        ]
