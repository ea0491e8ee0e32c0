"""Plain snapshots of what a scheduler may look at: the cluster's nodes and one ready task.

The simulator builds them from its own state (`sim.snapshot`); the daemon builds the same
types from live cluster state in Redis. Policies consume only these, so one encoder
serves both, and a model trained in simulation runs unchanged in production.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dagsched.core.estimates import raised_predictions_s
from dagsched.core.history import FamilySummary
from dagsched.core.workflow import TaskSpec, Workflow

# node kinds, in the order `ClusterView.kind` indexes them
NODE_KINDS: tuple[str, ...] = ("cpu", "gpu", "io", "mem")


@dataclass(frozen=True, slots=True)
class RunningAttempts:
    """The attempts running on a cluster's nodes, as a node agent and the job queue know them:
    per attempt, its node (an index into the view), when its compute began (its start plus its
    cold start), its declared run time there (the declared duration at the node's advertised
    speed, throttled when reserved below its declared CPU, times the node's measured slowdown)
    and what its family's history predicts (that times the predicted runtime ratio)."""

    node: np.ndarray  # int
    began_s: np.ndarray
    declared_s: np.ndarray
    predicted_s: np.ndarray

    @classmethod
    def on_nodes(
        cls,
        node: list[int],
        began_s: list[float],
        advertised_s: list[float],
        ratio: list[float],
        slowdown: np.ndarray,
    ) -> RunningAttempts:
        """From each attempt's node, compute start, advertised run time and its family's
        predicted runtime ratio, on nodes of measured `slowdown`: declared is the advertised
        time times the node's slowdown, predicted that times the ratio."""
        nodes = np.array(node, dtype=int)
        declared = np.array(advertised_s, dtype=float) * np.asarray(slowdown, dtype=float)[nodes]
        return cls(nodes, np.array(began_s, dtype=float), declared, declared * np.array(ratio))

    def first_ends_s(self, n: int, now: float) -> np.ndarray:
        """Per node of `n`, when its first running attempt is expected to end at `now`: the
        prediction, raised once outlived (`estimates.raised_prediction_s`); inf where none
        runs."""
        began = self.began_s
        ends = began + raised_predictions_s(self.predicted_s, now - began, self.declared_s)
        out = np.full(n, np.inf)
        np.minimum.at(out, self.node, ends)
        return out


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
    # per node, when the first of its running attempts is expected to end (absolute, from the
    # declared run times and history's runtime predictions; inf where none runs): given as is,
    # or else computed at `now` from `running`; None for both where it is not known (read as
    # "room now")
    first_end_s: np.ndarray | None = None
    running: RunningAttempts | None = None

    @property
    def n(self) -> int:
        return len(self.node_ids)

    def first_wait_s(self) -> np.ndarray:
        """Per node, the seconds until its first running attempt is expected to end: how long
        a task that does not fit now waits at least (0 where none runs or it is unknown)."""
        ends = self.first_ends_s()
        if ends is None:
            return np.zeros(self.n)
        left = ends - self.now
        return np.where(np.isfinite(left) & (left > 0.0), left, 0.0)

    def first_ends_s(self) -> np.ndarray | None:
        """`first_end_s`, or else computed from `running` at `now` (None when neither is
        known)."""
        if self.first_end_s is not None or self.running is None:
            return self.first_end_s
        return self.running.first_ends_s(self.n, self.now)

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
