"""Numeric views of simulator state: per-node, cluster-wide and per-task feature vectors.

These are the raw (unnormalised) features that the Gymnasium environment exposes and the
policy's observation encoder builds on. Column names are exported so attributions and
normalizers can refer to features by name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dagsched.sim.state import TaskRun, TaskState
from dagsched.sim.workflow import TaskType

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator

GB = 1e9

NODE_FEATURES: tuple[str, ...] = (
    "cpu_used",  # reserved share of cores
    "mem_free",  # free share of memory
    "queue_len",  # tasks waiting in the node's queue
    "net_in_gb",  # input data on the wire towards the node
    "failure_rate",  # decayed count of recent task failures
    "gpu_mem",  # GPU memory, normalised by the largest in the cluster
    "cpu_free_cores",  # free cores (absolute)
    "alive",
    "speed",  # this node's speed for the task being placed
)

CLUSTER_FEATURES: tuple[str, ...] = (
    "load_variance",  # variance of cpu_used over alive nodes
    "idle_fraction",  # share of alive nodes with nothing reserved
    "mean_queue_wait_s",  # queued work per core, averaged over alive nodes
    "pending",  # tasks queued on nodes
    "alive_fraction",
)

TASK_FEATURES: tuple[str, ...] = (
    "type_cpu",
    "type_io",
    "type_gpu",
    "type_mem",
    "duration_s",
    "cpu_cores",
    "mem_gb",
    "input_gb",
    "output_gb",
    "upward_rank_s",
    "n_parents",
    "n_children",
    "attempt",
    "slack_s",  # time left to the task's sub-deadline
)


def node_features(sim: Simulator, task: TaskRun | None = None) -> np.ndarray:
    """Float32 array [n_nodes, len(NODE_FEATURES)]; `speed` is for `task`'s type (1 if None)."""
    c, now = sim.cluster, sim.now
    free_cores = np.asarray(c.free_cores)
    out = np.empty((c.n, len(NODE_FEATURES)), dtype=np.float32)
    out[:, 0] = 1.0 - free_cores * c.inv_cores
    out[:, 1] = np.asarray(c.free_mem) * c.inv_mem
    out[:, 2] = c.queue_len
    out[:, 3] = [c.net_in_bytes(i, now) / GB for i in range(c.n)]
    out[:, 4] = [c.failure_rate(i, now) for i in range(c.n)]
    top = float(c.gpu_mem_gb.max())
    out[:, 5] = c.gpu_mem_gb / top if top > 0 else 0.0
    out[:, 6] = free_cores
    out[:, 7] = c.alive
    out[:, 8] = c.speed[:, task.spec.type] if task is not None else 1.0
    return out


def cluster_features(sim: Simulator, nodes: np.ndarray | None = None) -> np.ndarray:
    """Float32 vector of CLUSTER_FEATURES."""
    c = sim.cluster
    nodes = node_features(sim) if nodes is None else nodes
    alive = nodes[:, 7] > 0
    used = nodes[alive, 0] if alive.any() else np.zeros(1, dtype=np.float32)
    queued = np.asarray(c.queued_core_s) * c.inv_cores
    return np.array(
        [
            float(used.var()),
            float((used <= 1e-9).mean()),
            float(queued[alive].mean()) if alive.any() else 0.0,
            float(sum(c.queue_len)),
            float(alive.mean()),
        ],
        dtype=np.float32,
    )


def task_features(sim: Simulator, t: TaskRun) -> np.ndarray:
    """Float32 vector of TASK_FEATURES for a ready task."""
    s, run = t.spec, t.run
    onehot = [1.0 if s.type == k else 0.0 for k in TaskType]
    return np.array(
        [
            *onehot,
            s.duration_s,
            s.cpu_cores,
            s.mem_gb,
            s.input_bytes / GB,
            s.output_bytes / GB,
            run.upward_rank()[t.idx],
            len(run.wf.parents[t.idx]),
            len(run.wf.children[t.idx]),
            t.attempt,
            run.sub_deadline_s(t.idx) - sim.now,
        ],
        dtype=np.float32,
    )


def dag_status(t: TaskRun) -> np.ndarray:
    """Per task of `t`'s workflow: done, ready-or-queued, and is-this-task flags [size, 3]."""
    tasks = t.run.tasks
    out = np.zeros((len(tasks), 3), dtype=np.float32)
    for i, x in enumerate(tasks):
        out[i, 0] = x.state == TaskState.DONE
        out[i, 1] = x.state in (TaskState.READY, TaskState.QUEUED, TaskState.RUNNING)
    out[t.idx, 2] = 1.0
    return out
