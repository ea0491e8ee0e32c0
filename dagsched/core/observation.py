"""The observation: one function turns a `ClusterView` and a `TaskView` into raw features.

Used by training, the Gymnasium environment (views built from the simulator), the daemon
(views built from Redis) and `dagsched explain`, so a model sees the same numbers
everywhere. Pure numpy: no torch here, so the normalizer, the environment and tests can use
it without importing torch-geometric.

Per cluster node (NODE_FEATURES) the features describe the node - what is reserved and what
its telemetry says is really used - and the node *for this task* (speed for its type,
estimated transfer, queue wait and finish time, whether its request fits now), so one shared
scorer can rank any number of nodes. Run-time estimates take the node's advertised speed
times its measured slowdown (`ClusterView.slowdown`), so a node that has turned slow looks
slow as soon as its finished tasks show it.

What history says of the task's family (`TaskView.history`: observed count, CPU use, memory
peak and runtime ratio percentiles, OOM kills) enters as task context, with what it
predicts: runtime, cores and memory (`core.history.predicted_use`). The `pred` node features
are `heft_history`'s own numbers (`core.demand`): the request it would reserve, whether that
fits now, and its estimated finish time; the observation also carries `heft_history`'s
action at every node (`base`) and its node scores (`base_logits`), which the policy's
residual starts from. Nothing here is hidden truth: a history comes from measured outcomes
only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dagsched.core.demand import (
    FINISH_BETA,
    HEFT_RETRIES,
    candidates,
    demand_fractions,
    finish_s,
    fits_now,
    predicted_compute_s,
    recommended_request,
    srpt_priority,
    work_left_core_s,
)
from dagsched.core.estimates import transfers_s
from dagsched.core.history import predicted_use
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import TaskType, upward_rank

GB = 1e9

NODE_FEATURES: tuple[str, ...] = (
    "cpu_used",
    "mem_free",
    "queue_len",
    "queue_wait_s",
    "net_in_gb",
    "failure_rate",
    "gpu_mem",
    "cpu_left_after",
    "alive",
    "speed",
    "log_compute_s",
    "log_transfer_s",
    "fits_now",
    "mem_ok",
    "was_prev_node",
    "log_finish_s",
    "cpu_demand_frac",
    "mem_demand_frac",
    "cpu_really_used",
    "mem_really_used",
    "cpu_pred_frac",
    "mem_pred_frac",
    "pred_fits_now",
    "pred_mem_ok",
    "log_pred_finish_s",
)
CLUSTER_FEATURES: tuple[str, ...] = (
    "load_variance",
    "idle_fraction",
    "mean_queue_wait_s",
    "pending",
    "alive_fraction",
    "task_slack_s",
    "task_attempt",
    "task_log_duration_s",
    "task_cpu_cores",
    "task_mem_gb",
    "cpu_really_used_mean",
    "mem_really_used_mean",
    "hist_known",
    "hist_log_count",
    "hist_cpu_p50",
    "hist_cpu_p90",
    "hist_mem_p50",
    "hist_mem_p90",
    "hist_runtime_ratio",
    "hist_runtime_p90",
    "hist_log_ooms",
    "hist_oom_limit",
    "pred_log_runtime_s",
    "pred_cpu_cores",
    "pred_mem_gb",
)
FINISH = NODE_FEATURES.index("log_pred_finish_s")  # heft_history's estimated finish
DAG_FEATURES: tuple[str, ...] = (
    "type_cpu",
    "type_io",
    "type_gpu",
    "type_mem",
    "log_duration_s",
    "cpu_cores",
    "mem_gb",
    "log_input_gb",
    "log_upward_rank_s",
    "done",
    "active",
)


@dataclass(slots=True)
class Observation:
    """Raw features of one decision. `edges` is [2, E] parent -> child within the DAG."""

    nodes: np.ndarray  # [n_nodes, len(NODE_FEATURES)]
    mask: np.ndarray  # [n_nodes] bool: alive nodes may be chosen
    cluster: np.ndarray  # [len(CLUSTER_FEATURES)]
    dag: np.ndarray  # [n_tasks, len(DAG_FEATURES)]
    edges: np.ndarray  # [2, E] int64
    task_idx: int  # row of `dag` that is the task being placed
    # heft_history's action at each node, in value space: CPU and memory fractions (float32,
    # as heft_history reserves them), retries, priority
    base: np.ndarray  # [n_nodes, 4] float32
    base_logits: np.ndarray  # [n_nodes] float32: heft_history's node scores, unmasked


def observation_to_dict(o: Observation) -> dict[str, Any]:
    """A JSON-able form of an observation (for the decision log)."""
    return {
        "nodes": o.nodes.round(6).tolist(),
        "mask": o.mask.astype(int).tolist(),
        "cluster": o.cluster.round(6).tolist(),
        "dag": o.dag.round(6).tolist(),
        "edges": o.edges.tolist(),
        "task_idx": o.task_idx,
        "base": o.base.tolist(),
        "base_logits": o.base_logits.tolist(),
    }


def observation_from_dict(d: dict[str, Any]) -> Observation:
    """Inverse of `observation_to_dict`; raises ValueError on a malformed record."""
    try:
        nodes = np.asarray(d["nodes"], dtype=np.float32)
        o = Observation(
            nodes=nodes,
            mask=np.asarray(d["mask"], dtype=bool),
            cluster=np.asarray(d["cluster"], dtype=np.float32),
            dag=np.asarray(d["dag"], dtype=np.float32),
            edges=np.asarray(d["edges"], dtype=np.int64).reshape(2, -1),
            task_idx=int(d["task_idx"]),
            base=np.asarray(d["base"], dtype=np.float32).reshape(-1, 4),
            base_logits=np.asarray(d["base_logits"], dtype=np.float32),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed observation record: {exc}") from None
    if nodes.ndim != 2 or nodes.shape[1] != len(NODE_FEATURES):
        raise ValueError("observation record has other node features than this code")
    return o


ANCHOR_FLOOR = 0.02  # the head clamps its anchor (the base in unit space) to [floor, 1 - floor]


def base_action(cpu_f: np.ndarray, mem_f: np.ndarray, priority: np.ndarray | float) -> np.ndarray:
    """heft_history's action at each node ([..., n] fractions, a priority per task or one):
    [..., n, 4] float32 (CPU, memory, `HEFT_RETRIES`, priority)."""
    shape = np.shape(cpu_f)
    return np.stack(
        [
            cpu_f,
            mem_f,
            np.full(shape, float(HEFT_RETRIES)),
            np.broadcast_to(np.asarray(priority, dtype=float), shape),
        ],
        axis=-1,
    ).astype(np.float32)


def finish_logits(log_finish: np.ndarray) -> np.ndarray:
    """heft_history's node scores from float32 `log1p(estimated finish s)`: float32."""
    return np.float32(-FINISH_BETA) * log_finish.astype(np.float32)


def transfer_estimate_s(cluster: ClusterView, task: TaskView) -> np.ndarray:
    """Per node: the slowest input transfer from the parents' nodes (0 when co-located)."""
    return transfer_estimates_s(cluster, [task])[0]


def transfer_estimates_s(cluster: ClusterView, tasks: Sequence[TaskView]) -> np.ndarray:
    """`transfer_estimate_s` of each task, [B, n]: every placed parent of the batch in one
    pass."""
    owner: list[int] = []
    src: list[int] = []
    nbytes: list[float] = []
    for i, task in enumerate(tasks):
        wf = task.workflow
        for p, node in zip(wf.parents[task.idx], task.parent_nodes, strict=True):
            if node >= 0:
                owner.append(i)
                src.append(node)
                nbytes.append(wf.tasks[p].output_bytes)
    out = np.zeros((len(tasks), cluster.n))
    if owner:
        t = transfers_s(
            cluster.zone, cluster.net_gbps, np.array(src, dtype=np.int64), np.array(nbytes, float)
        )
        np.maximum.at(out, np.array(owner, dtype=np.int64), t)
    return out


def dag_features(task: TaskView, rank: list[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The task's workflow as a graph: DAG_FEATURES per task [size, F] and edges [2, E].

    Depends on where the workflow stands, not on the cluster nor on which of its tasks is
    placed (the model reads the placed task's row, `Observation.task_idx`): the ready tasks
    of one workflow share one DAG, so a batch encodes it once however many of its tasks it
    places (a map stage of 2,000 siblings costs one encoding, not 2,000). `rank` caches the
    DAG's upward ranks."""
    wf = task.workflow
    rank = rank if rank is not None else upward_rank(wf)
    dag = np.zeros((wf.size, len(DAG_FEATURES)), dtype=np.float32)
    for i, t in enumerate(wf.tasks):
        dag[i, int(t.type)] = 1.0
        dag[i, 4] = np.log1p(t.duration_s)
        dag[i, 5] = t.cpu_cores
        dag[i, 6] = t.mem_gb
        dag[i, 7] = np.log1p(t.input_bytes / GB)
        dag[i, 8] = np.log1p(rank[i])
    dag[:, 9] = task.done
    dag[:, 10] = task.active
    edges = np.array(wf.edges, dtype=np.int64).T.reshape(2, -1)
    return dag, edges


def task_context(
    task: TaskView,
    now: float,
    prediction: tuple[float, float, float],
    alive_frac: float,
    used_c: float,
    used_m: float,
) -> list[float]:
    """The cluster features after the four load aggregates: the alive share, the task's slack,
    attempt and declared demands, the mean measured use, and what history says of its family
    (`prediction`: `predicted_use`'s cores, memory and runtime ratio)."""
    spec = task.workflow.tasks[task.idx]
    h = task.history
    p_cores, p_mem, p_rt = prediction
    known = h is not None and h.count > 0
    # percentiles of a family seen finishing; ratio 1 (as declared) for one never seen
    p50_p90 = (
        (h.cpu_p50, h.cpu_p90, h.mem_p50, h.mem_p90)
        if known and h is not None
        else (1.0, 1.0, 1.0, 1.0)
    )
    return [
        alive_frac,
        task.sub_deadline_s - now,
        task.attempt,
        np.log1p(spec.duration_s),
        spec.cpu_cores,
        spec.mem_gb,
        used_c,
        used_m,
        float(known),
        np.log1p(h.count) if h is not None else 0.0,
        *p50_p90,
        p_rt,
        h.runtime_p90 if known and h is not None else 1.0,
        np.log1p(h.ooms) if h is not None else 0.0,
        h.oom_limit if h is not None else 0.0,
        np.log1p(spec.duration_s * p_rt),
        p_cores,
        p_mem,
    ]


def observe(
    cluster: ClusterView, task: TaskView, dag: tuple[np.ndarray, np.ndarray] | None = None
) -> Observation:
    """Raw features for placing `task` on `cluster`; `dag` is the task's `dag_features` when
    the caller has them already."""
    spec = task.workflow.tasks[task.idx]
    h = task.history
    alive = cluster.alive.astype(bool)
    n = cluster.n
    inv_c = 1.0 / cluster.cores
    inv_m = 1.0 / cluster.mem_gb
    cpu_used = 1.0 - cluster.free_cores * inv_c
    cpu_f, mem_f = demand_fractions(cluster, spec.cpu_cores, spec.mem_gb)
    res_c, res_m = cpu_f * cluster.cores, mem_f * cluster.mem_gb
    speed = cluster.speed[:, int(spec.type)]
    slow = np.maximum(1.0, spec.cpu_cores / res_c)
    compute = spec.duration_s / speed * slow * cluster.slowdown
    transfer = transfer_estimate_s(cluster, task)
    fits = fits_now(cluster, res_c, res_m)
    wait = cluster.queued_core_s * inv_c + np.where(fits, 0.0, compute.mean())
    # what history predicts (the runtime; the use, for the task context) and recommends
    # reserving: heft_history's request, its candidates and its estimated finish time
    p_cores, p_mem, p_rt = predicted_use(spec.cpu_cores, spec.mem_gb, h)
    rec_cores, rec_mem = recommended_request(spec.cpu_cores, spec.mem_gb, h)
    p_cpu_f, p_mem_f = demand_fractions(cluster, rec_cores, rec_mem)
    p_res_c, p_res_m = p_cpu_f * cluster.cores, p_mem_f * cluster.mem_gb
    p_compute = predicted_compute_s(
        spec.duration_s, p_rt, speed, spec.cpu_cores, p_res_c, cluster.slowdown
    )
    p_fits = fits_now(cluster, p_res_c, p_res_m)
    queued = cluster.queued_core_s * inv_c
    p_finish = finish_s(queued, p_fits, cluster.first_wait_s(), transfer, p_compute)
    used_c = cluster.used_cores * inv_c if cluster.used_cores is not None else np.zeros(n)
    used_m = cluster.used_mem * inv_m if cluster.used_mem is not None else np.zeros(n)
    top_gpu = float(cluster.gpu_mem_gb.max())
    nodes = np.stack(
        [
            cpu_used,
            cluster.free_mem * inv_m,
            cluster.queue_len,
            cluster.queued_core_s * inv_c,
            cluster.net_in_bytes / GB,
            cluster.failure_rate,
            cluster.gpu_mem_gb / top_gpu if top_gpu > 0 else np.zeros(n),
            (cluster.free_cores - res_c) * inv_c,
            alive.astype(float),
            speed,
            np.log1p(compute),
            np.log1p(transfer),
            fits.astype(float),
            (res_m >= spec.mem_gb - 1e-9).astype(float),
            (np.arange(n) == task.prev_node).astype(float),
            np.log1p(wait + transfer + spec.cold_start_s + compute),
            cpu_f,
            mem_f,
            used_c,
            used_m,
            p_cpu_f,
            p_mem_f,
            p_fits.astype(float),
            (p_res_m >= rec_mem - 1e-9).astype(float),
            np.log1p(p_finish),
        ],
        axis=1,
    ).astype(np.float32)

    used = cpu_used[alive] if alive.any() else np.zeros(1)
    cl = np.array(
        [
            float(used.var()),
            float((used <= 1e-9).mean()),
            float(queued[alive].mean()) if alive.any() else 0.0,
            float(cluster.queue_len.sum()),
            *task_context(
                task,
                cluster.now,
                (p_cores, p_mem, p_rt),
                float(alive.mean()),
                float(used_c[alive].mean()) if alive.any() else 0.0,
                float(used_m[alive].mean()) if alive.any() else 0.0,
            ),
        ],
        dtype=np.float32,
    )

    dag_x, edges = dag if dag is not None else dag_features(task)
    return Observation(
        nodes=nodes,
        mask=candidates(cluster, alive, rec_mem),
        cluster=cl,
        dag=dag_x,
        edges=edges,
        task_idx=task.idx,
        base=base_action(p_cpu_f, p_mem_f, srpt_priority(work_left_core_s(task))),
        base_logits=finish_logits(nodes[:, FINISH]),
    )


assert len(TaskType) == 4  # DAG_FEATURES one-hot assumes the four task types
