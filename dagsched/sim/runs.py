"""Runtime state of workflows and tasks inside a simulation, and the policy contract.

A policy is handed the tasks that became ready at the same instant and answers with one
`Decision` per task, in the order they should be placed. It may read anything on the
simulator (cluster arrays, task runs) but never writes.
"""

from __future__ import annotations

from enum import IntEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from dagsched.core.bounds import RETRY_BOUNDS
from dagsched.core.workflow import TaskSpec, Workflow, downward_finish_s, upward_rank

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


class TaskState(IntEnum):
    """Where a task is in its life."""

    WAITING = 0  # parents not done
    READY = 1  # waiting for a decision
    QUEUED = 2  # placed, waiting in a node's queue
    RUNNING = 3  # reservation held (transfer, cold start, compute)
    DONE = 4
    CANCELLED = 5  # its workflow failed


class FailureKind(IntEnum):
    """Why an attempt failed."""

    TRANSIENT = 0
    OOM = 1
    NODE_DOWN = 2


class Decision(NamedTuple):
    """A placement: node id, CPU and memory reservation as fractions of the node, max retries,
    and its priority in the node's queue (higher first; equal ones in the order queued)."""

    task: TaskRun
    node: int
    cpu: float
    mem: float
    max_retries: int
    priority: float = 0.0


class Policy(Protocol):
    """Anything that places ready tasks."""

    name: str

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        """One decision per task in `ready`, in placement order; never a dead node."""
        ...


class WorkflowRun:
    """A workflow in flight: its task runs and how many are left."""

    __slots__ = ("cp", "failed", "finish", "rank", "remaining", "tasks", "wf")

    def __init__(self, wf: Workflow) -> None:
        self.wf = wf
        self.tasks = [TaskRun(self, i, spec) for i, spec in enumerate(wf.tasks)]
        self.remaining = wf.size
        self.failed = False
        self.rank: list[float] | None = None  # upward ranks, computed on demand
        self.finish = downward_finish_s(wf)  # for per-task sub-deadlines
        self.cp = max(self.finish)

    def upward_rank(self) -> list[float]:
        """HEFT upward ranks at reference speed, cached."""
        if self.rank is None:
            self.rank = upward_rank(self.wf)
        return self.rank

    def sub_deadline_s(self, idx: int) -> float:
        """Absolute time task `idx` should finish by for its workflow to meet the deadline."""
        return self.wf.arrival_s + self.wf.deadline_s * self.finish[idx] / self.cp


class TaskRun:
    """One task's runtime state across its attempts."""

    __slots__ = (
        "advertised_s",
        "after_oom",
        "attempt",
        "compute_s",
        "compute_start_s",
        "cpu",
        "credit",
        "decided_jain",
        "draws",
        "end_s",
        "failures",
        "idx",
        "max_retries",
        "mem",
        "node",
        "peak_mem",
        "prev_node",
        "priority",
        "queued_seq",
        "ready_s",
        "res_cores",
        "res_mem",
        "run",
        "spec",
        "start_s",
        "state",
        "token",
        "transfer_bytes",
        "transfer_s",
        "true_s",
        "use_cores",
        "waiting_parents",
    )

    def __init__(self, run: WorkflowRun, idx: int, spec: TaskSpec) -> None:
        self.run = run
        self.idx = idx
        self.spec = spec
        self.state = TaskState.WAITING
        self.waiting_parents = len(run.wf.parents[idx])
        self.attempt = 0
        self.draws: list[list[float]] | None = None  # per attempt, with keyed attempt draws
        self.failures = 0
        self.after_oom = False  # its last failed attempt was OOM-killed
        self.node = -1
        self.prev_node = -1
        self.cpu = self.mem = 0.0
        self.res_cores = self.res_mem = 0.0
        self.max_retries = RETRY_BOUNDS[0]
        self.priority = 0.0  # in its node's queue: higher first
        self.queued_seq = 0  # when it was queued, for equal priorities
        self.ready_s = self.start_s = self.compute_start_s = self.end_s = 0.0
        self.compute_s = self.transfer_s = self.transfer_bytes = 0.0
        self.advertised_s = 0.0  # compute time the node's advertised speed implies
        self.decided_jain = 1.0
        self.token = 0
        # hidden truth, set by the simulator when the workflow arrives (never read by policies)
        self.use_cores = spec.cpu_cores  # average cores it really uses
        self.peak_mem = spec.mem_gb  # its real memory peak, GB
        self.true_s = spec.duration_s  # its real compute time at reference speed
        self.credit = 0.0  # workflow-seconds of the completion term its decision carries

    @property
    def key(self) -> str:
        """Stable id: workflow id and task index."""
        return f"{self.run.wf.id}/{self.idx}"

    def __repr__(self) -> str:
        return f"TaskRun({self.key}, {self.state.name}, attempt={self.attempt}, node={self.node})"
