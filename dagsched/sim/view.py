"""Plain snapshots of what a scheduler may look at: the cluster's nodes and one ready task.

The simulator builds them from its own state (`cluster_view`, `task_view`); the daemon builds
the same types from live cluster state in Redis. Policies consume only these, so one encoder
serves both, and a model trained in simulation runs unchanged in production.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from dagsched.sim.history import FamilySummary, summarize
from dagsched.sim.state import TaskRun, TaskState
from dagsched.sim.workflow import TaskSpec, Workflow

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


@dataclass(slots=True)
class ClusterView:
    """Per-node arrays (length n) at time `now`. `speed` is [n, 4]: node speed per task type,
    as advertised; `slowdown` is the measured ratio of actual to advertised run time (1 on a
    node that performs as advertised)."""

    now: float
    node_ids: list[str]
    kind: np.ndarray  # int index into NODE_KINDS
    zone: np.ndarray  # int
    cores: np.ndarray
    mem_gb: np.ndarray
    gpu_mem_gb: np.ndarray
    net_gbps: np.ndarray
    speed: np.ndarray
    alive: np.ndarray  # bool
    free_cores: np.ndarray
    free_mem: np.ndarray
    queue_len: np.ndarray
    queued_core_s: np.ndarray
    net_in_bytes: np.ndarray
    failure_rate: np.ndarray
    slowdown: np.ndarray
    # measured use (node telemetry): cores and GB really in use, next to what is reserved;
    # None where nothing reports it (read as zeros)
    used_cores: np.ndarray | None = None
    used_mem: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.node_ids)

    def batch_copy(self) -> ClusterView:
        """A copy whose live load (free resources, queues) `take` may update, so later tasks
        of a batch see the earlier placements; the static arrays are shared."""
        return replace(
            self,
            free_cores=self.free_cores.astype(float),
            free_mem=self.free_mem.astype(float),
            queue_len=self.queue_len.astype(float),
            queued_core_s=self.queued_core_s.astype(float),
        )

    def take(self, task: TaskView, node: int, cpu: float, mem: float) -> bool:
        """Record in place that `task` goes to `node` with these reservation fractions, as the
        cluster will see it: it runs now if it fits in what is free (True; nodes backfill, so
        a queue in front does not hold it back), else it queues."""
        spec = task.workflow.tasks[task.idx]
        cores, mem_gb = cpu * self.cores[node], mem * self.mem_gb[node]
        fits = bool(self.free_cores[node] + 1e-9 >= cores and self.free_mem[node] + 1e-9 >= mem_gb)
        if fits:
            self.free_cores[node] -= cores
            self.free_mem[node] -= mem_gb
        else:
            self.queue_len[node] += 1
            # as the cluster's own queue accounting does: at the advertised speed
            self.queued_core_s[node] += cores * spec.duration_s / self.speed[node, int(spec.type)]
        return fits


@dataclass(slots=True)
class TaskView:
    """One task to place, with its whole workflow and where the workflow stands."""

    workflow: Workflow
    idx: int
    attempt: int
    done: np.ndarray  # bool per task of the workflow
    active: np.ndarray  # bool per task: ready, queued or running
    parent_nodes: list[int]  # node index each parent ran on (-1 unknown), as wf.parents[idx]
    prev_node: int  # node of the previous failed attempt, -1 if none
    sub_deadline_s: float  # absolute time the task should finish by
    history: FamilySummary | None = None  # what history says of the task's family

    @property
    def key(self) -> str:
        return f"{self.workflow.id}/{self.idx}"


def cluster_view(sim: Simulator) -> ClusterView:
    """The simulator's cluster now, as a `ClusterView`."""
    c, now = sim.cluster, sim.now
    return ClusterView(
        now=now,
        node_ids=[f"node-{i:04d}" for i in range(c.n)],
        kind=c.kind_idx.copy(),
        zone=np.array([x.zone for x in c.nodes]),
        cores=c.cores,
        mem_gb=c.mem_gb,
        gpu_mem_gb=c.gpu_mem_gb,
        net_gbps=c.net_gbps,
        speed=c.speed,
        alive=np.array(c.alive, dtype=bool),
        free_cores=np.array(c.free_cores),
        free_mem=np.array(c.free_mem),
        queue_len=np.array(c.queue_len, dtype=float),
        queued_core_s=np.array(c.queued_core_s),
        net_in_bytes=np.array([c.net_in_bytes(i, now) for i in range(c.n)]),
        failure_rate=np.array([c.failure_rate(i, now) for i in range(c.n)]),
        slowdown=np.array(c.observed_slowdown),
        used_cores=np.array([u[0] for u in sim.node_use]),
        used_mem=np.array([u[1] for u in sim.node_use]),
    )


def task_view(t: TaskRun, sim: Simulator | None = None) -> TaskView:
    """A ready task of the simulator as a `TaskView`, with its family's history from `sim`
    (none without it)."""
    run = t.run
    states = np.array([x.state for x in run.tasks])
    return TaskView(
        workflow=run.wf,
        idx=t.idx,
        attempt=t.attempt,
        done=states == TaskState.DONE,
        active=(states == TaskState.READY)
        | (states == TaskState.QUEUED)
        | (states == TaskState.RUNNING),
        parent_nodes=[run.tasks[p].node for p in run.wf.parents[t.idx]],
        prev_node=t.prev_node,
        sub_deadline_s=run.sub_deadline_s(t.idx),
        history=summarize(sim.history.get(t.spec.family)) if sim is not None else None,
    )


def map_stage(proto: TaskSpec, width: int, now: float) -> list[TaskView]:
    """A map stage ready at once: a workflow of a root (done), `width` copies of `proto`
    (ready, deadline in an hour) and a reduce, arrived at `now`; its `width` ready tasks.
    The burst a busy job queue hands a scheduler (bench/map_burst.py, the fast path's
    exactness test)."""
    tasks = [replace(proto, name=f"t{i}") for i in range(width + 2)]
    edges = [(0, i) for i in range(1, width + 1)] + [(i, width + 1) for i in range(1, width + 1)]
    wf = Workflow.build(f"map-{width}", tasks, edges, arrival_s=now)
    done = np.zeros(width + 2, dtype=bool)
    done[0] = True
    active = np.zeros(width + 2, dtype=bool)
    active[1 : width + 1] = True
    return [
        TaskView(wf, i, 0, done.copy(), active.copy(), [0], -1, now + 3600.0)
        for i in range(1, width + 1)
    ]
