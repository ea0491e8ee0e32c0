"""Workflow DAGs: immutable task specs, edges and the graph algorithms every part needs.

A `Workflow` is what the generator, the templates and the WfFormat importer produce and what
the simulator (and later the daemon) consumes. Task indices are positions in `tasks`; edges
point parent -> child and every workflow is validated to be a connected DAG.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum


class TaskType(IntEnum):
    """What a task is bound by; nodes run each type at their own speed."""

    CPU = 0
    IO = 1
    GPU = 2
    MEM = 3


TASK_TYPE_NAMES: tuple[str, ...] = tuple(t.name.lower() for t in TaskType)


class WorkflowError(ValueError):
    """A workflow is malformed: cyclic, dangling references, bad values."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One task as submitted: what it needs, not where it ran.

    `duration_s` is the compute time at reference speed (speed factor 1.0) with its full CPU
    demand reserved; `output_bytes` is the data each child must receive before it starts.
    These are declared values: what the task really uses and how long it really runs is the
    simulator's hidden truth (`sim.truth`). `family` names the recurring kind of task it is
    (a template's stage, a WfFormat task name without its number); it defaults to `name`.
    """

    name: str
    type: TaskType
    duration_s: float
    cpu_cores: float
    mem_gb: float
    input_bytes: float = 0.0
    output_bytes: float = 0.0
    cold_start_s: float = 0.0
    family: str = ""

    def __post_init__(self) -> None:
        if not self.family:
            object.__setattr__(self, "family", self.name)
        if not self.duration_s > 0:
            raise WorkflowError(
                f"task {self.name!r}: duration_s must be > 0, got {self.duration_s}"
            )
        if not self.cpu_cores > 0:
            raise WorkflowError(f"task {self.name!r}: cpu_cores must be > 0, got {self.cpu_cores}")
        if not self.mem_gb > 0:
            raise WorkflowError(f"task {self.name!r}: mem_gb must be > 0, got {self.mem_gb}")
        for attr in ("input_bytes", "output_bytes", "cold_start_s"):
            if getattr(self, attr) < 0:
                raise WorkflowError(f"task {self.name!r}: {attr} must be >= 0")


@dataclass(slots=True)
class Workflow:
    """A DAG of tasks with an arrival time and a relative deadline.

    Build with `Workflow.build(...)`, which validates the graph; the adjacency lists are then
    treated as read-only by everyone.
    """

    id: str
    tasks: list[TaskSpec]
    parents: list[list[int]]
    children: list[list[int]]
    arrival_s: float = 0.0
    deadline_s: float = float("inf")
    source: str = "generated"
    topo: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        id: str,
        tasks: Sequence[TaskSpec],
        edges: Iterable[tuple[int, int]],
        *,
        arrival_s: float = 0.0,
        deadline_s: float | None = None,
        slack: float = 2.0,
        source: str = "generated",
    ) -> Workflow:
        """Validate `edges` (parent, child) over `tasks` and return the workflow.

        Without `deadline_s` the deadline is the critical path at reference speed x `slack`.
        Raises `WorkflowError` for empty, cyclic, self-looped, dangling or duplicate edges.
        """
        n = len(tasks)
        if n == 0:
            raise WorkflowError(f"workflow {id!r} has no tasks")
        parents: list[list[int]] = [[] for _ in range(n)]
        children: list[list[int]] = [[] for _ in range(n)]
        seen: set[tuple[int, int]] = set()
        for p, c in edges:
            if not (0 <= p < n and 0 <= c < n):
                raise WorkflowError(f"workflow {id!r}: edge ({p}, {c}) refers to a missing task")
            if p == c:
                raise WorkflowError(f"workflow {id!r}: task {tasks[p].name!r} depends on itself")
            if (p, c) in seen:
                continue
            seen.add((p, c))
            parents[c].append(p)
            children[p].append(c)
        topo = topological_order(children, parents)
        if len(topo) != n:
            stuck = sorted(set(range(n)) - set(topo))
            names = ", ".join(tasks[i].name for i in stuck[:5])
            raise WorkflowError(f"workflow {id!r} has a cycle through tasks: {names}")
        wf = cls(
            id=id,
            tasks=list(tasks),
            parents=parents,
            children=children,
            arrival_s=arrival_s,
            source=source,
            topo=topo,
        )
        wf.deadline_s = deadline_s if deadline_s is not None else critical_path_s(wf) * slack
        if not wf.deadline_s > 0:
            raise WorkflowError(f"workflow {id!r}: deadline must be > 0")
        return wf

    @property
    def size(self) -> int:
        return len(self.tasks)

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(p, c) for p, cs in enumerate(self.children) for c in cs]

    def entries(self) -> list[int]:
        return [i for i, ps in enumerate(self.parents) if not ps]

    def exits(self) -> list[int]:
        return [i for i, cs in enumerate(self.children) if not cs]

    def is_connected(self) -> bool:
        """True when the DAG is weakly connected (one piece)."""
        seen = {0}
        todo = deque([0])
        while todo:
            i = todo.popleft()
            for j in (*self.parents[i], *self.children[i]):
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return len(seen) == self.size


_NUMBERED = re.compile(r"(?:[-_:.#]?(?:ID)?\d+)+$")


def family_of(name: str) -> str:
    """A task name without its numeric suffix: "map-12" -> "map", "mProject_00000012" ->
    "mProject". Names that are only a number keep it."""
    return _NUMBERED.sub("", name) or name


def topological_order(
    children: Sequence[Sequence[int]], parents: Sequence[Sequence[int]]
) -> list[int]:
    """Kahn's algorithm; a result shorter than the graph means there is a cycle."""
    indeg = [len(ps) for ps in parents]
    todo = deque(i for i, d in enumerate(indeg) if d == 0)
    order: list[int] = []
    while todo:
        i = todo.popleft()
        order.append(i)
        for c in children[i]:
            indeg[c] -= 1
            if indeg[c] == 0:
                todo.append(c)
    return order


def task_time_s(task: TaskSpec) -> float:
    """Reference-speed time of one task: cold start plus compute."""
    return task.cold_start_s + task.duration_s


def critical_path_s(wf: Workflow) -> float:
    """Longest entry-to-exit path of task times at reference speed, transfers excluded."""
    finish = [0.0] * wf.size
    for i in wf.topo:
        start = max((finish[p] for p in wf.parents[i]), default=0.0)
        finish[i] = start + task_time_s(wf.tasks[i])
    return max(finish)


def upward_rank(wf: Workflow, speed: float = 1.0, transfer_s_per_byte: float = 0.0) -> list[float]:
    """HEFT's upward rank: a task's time plus the longest path from it to an exit.

    `speed` scales compute times (mean speed over nodes); `transfer_s_per_byte` prices the
    edges (mean inverse bandwidth), zero to ignore communication.
    """
    rank = [0.0] * wf.size
    for i in reversed(wf.topo):
        t = wf.tasks[i]
        tail = max(
            (t.output_bytes * transfer_s_per_byte + rank[c] for c in wf.children[i]), default=0.0
        )
        rank[i] = t.cold_start_s + t.duration_s / speed + tail
    return rank


def downward_finish_s(wf: Workflow) -> list[float]:
    """Earliest finish of each task relative to arrival on an infinite reference cluster."""
    finish = [0.0] * wf.size
    for i in wf.topo:
        start = max((finish[p] for p in wf.parents[i]), default=0.0)
        finish[i] = start + task_time_s(wf.tasks[i])
    return finish
