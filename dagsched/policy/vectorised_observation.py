"""A batch's observations from one snapshot, in one vectorised pass, updated as it is placed.

`observe(view, task)` (core/observation.py) is the definition; this is the same arithmetic
over a [tasks, nodes] grid, so a batch of B tasks costs a few dozen numpy calls instead of B
times ~50. What a placement changes - a node's free cores and memory, its queue - enters only
the node features that read them (DYNAMIC) and four cluster aggregates; those are recomputed
per task on the view as `ClusterView.take` leaves it, with `observe`'s own expressions on
whole node arrays. Everything else is per (task, node) and computed once.

The observations are `observe`'s bit for bit (the daemon's decision log compares the first
one with `observe`; `tests/policy/test_fast_exact.py` compares all of them, on several
scenarios and node counts), and the shared helpers (`demand_fractions`, `fits_now`,
`predicted_compute_s`, `finish_s`, `task_context`, `transfer_estimates_s`, `dag_features`,
`predicted_use`) are called, not copied, so a change there is followed here.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from dagsched.core.demand import (
    WorkLeft,
    candidates,
    demand_fractions,
    finish_s,
    fits_now,
    predicted_compute_s,
    recommended_request,
    srpt_priority,
)
from dagsched.core.history import predicted_use
from dagsched.core.observation import (
    DAG_FEATURES,
    FINISH,
    GB,
    NODE_FEATURES,
    Observation,
    base_action,
    dag_features,
    finish_logits,
    task_context,
    transfer_estimates_s,
)
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import Workflow, upward_rank

# the node features a placement can change (they read free cores, free memory or the queue)
DYNAMIC: tuple[int, ...] = tuple(
    NODE_FEATURES.index(f)
    for f in (
        "cpu_used",
        "mem_free",
        "queue_len",
        "queue_wait_s",
        "cpu_left_after",
        "fits_now",
        "log_finish_s",
        "pred_fits_now",
        "log_pred_finish_s",
    )
)
_COL = {f: i for i, f in enumerate(NODE_FEATURES)}
_DONE, _ACTIVE = (DAG_FEATURES.index(f) for f in ("done", "active"))
# a DAG input: its workflow object's id and which tasks are done and active (packed bits)
DagKey = tuple[int, bytes, bytes]


class BatchObservation:
    """The observations of `tasks`, in order, on `view` (a `batch_copy`, placed on with
    `take`). `nodes0` holds every task's node features on the snapshot; `nodes(i)` and
    `cluster(i)` give task `i`'s on the view as the earlier placements left it."""

    def __init__(
        self, view: ClusterView, tasks: Sequence[TaskView], cache: DagCache | None = None
    ) -> None:
        self.view, self.tasks = view, list(tasks)
        v, n, b = view, view.n, len(tasks)
        self.alive = v.alive.astype(bool)
        self.inv_c, self.inv_m = 1.0 / v.cores, 1.0 / v.mem_gb
        specs = [t.workflow.tasks[t.idx] for t in tasks]
        cpu = np.array([[s.cpu_cores] for s in specs], dtype=float)
        mem = np.array([[s.mem_gb] for s in specs], dtype=float)
        dur = np.array([[s.duration_s] for s in specs], dtype=float)
        self.cold = np.array([[s.cold_start_s] for s in specs], dtype=float)
        types = np.array([int(s.type) for s in specs], dtype=np.int64)
        preds = [
            predicted_use(s.cpu_cores, s.mem_gb, t.history)
            for s, t in zip(specs, tasks, strict=True)
        ]
        p_rt = np.array([[p[2]] for p in preds], dtype=float)
        rec = [
            recommended_request(s.cpu_cores, s.mem_gb, t.history)
            for s, t in zip(specs, tasks, strict=True)
        ]
        rec_c = np.array([[r[0]] for r in rec], dtype=float)
        rec_m = np.array([[r[1]] for r in rec], dtype=float)

        # the helpers take one task's numbers; they broadcast a [B, 1] column of them to [B, n]
        cpu_f, mem_f = demand_fractions(v, cpu, mem)  # type: ignore[arg-type]
        self.res_c, self.res_m = cpu_f * v.cores, mem_f * v.mem_gb
        speed = np.ascontiguousarray(v.speed[:, types].T)
        slow = np.maximum(1.0, cpu / self.res_c)
        self.compute = dur / speed * slow * v.slowdown
        self.transfer = transfer_estimates_s(v, tasks).reshape(b, n)
        # each row's mean as `ndarray.mean` computes it (the same pairwise sum), in one call
        self.compute_mean = np.add.reduce(self.compute, axis=1) / n
        p_cpu_f, p_mem_f = demand_fractions(v, rec_c, rec_m)  # type: ignore[arg-type]
        self.p_res_c, self.p_res_m = p_cpu_f * v.cores, p_mem_f * v.mem_gb
        self.p_compute = predicted_compute_s(dur, p_rt, speed, cpu, self.p_res_c, v.slowdown)
        self.first_wait = v.first_wait_s()
        used_c = v.used_cores * self.inv_c if v.used_cores is not None else np.zeros(n)
        used_m = v.used_mem * self.inv_m if v.used_mem is not None else np.zeros(n)
        top_gpu = float(v.gpu_mem_gb.max())

        # float32 from the start: assigning float64 columns rounds each value as astype does.
        # Written as [F, B, n] planes (each write contiguous), then turned [B, n, F] in one
        # copy: a column write into [B, n, F] streams the whole array through the cache
        # (~1 ms each at 2,048 nodes x 64 tasks, ~25 of them)
        x = np.empty((len(NODE_FEATURES), b, n), dtype=np.float32)
        x[_COL["net_in_gb"]] = v.net_in_bytes / GB
        x[_COL["failure_rate"]] = v.failure_rate
        x[_COL["gpu_mem"]] = v.gpu_mem_gb / top_gpu if top_gpu > 0 else np.zeros(n)
        x[_COL["alive"]] = self.alive.astype(float)
        x[_COL["speed"]] = speed
        x[_COL["log_compute_s"]] = np.log1p(self.compute)
        x[_COL["log_transfer_s"]] = np.log1p(self.transfer)
        x[_COL["mem_ok"]] = (self.res_m >= mem - 1e-9).astype(float)
        prev = np.array([[t.prev_node] for t in tasks], dtype=np.int64)
        x[_COL["was_prev_node"]] = (np.arange(n) == prev).astype(float)
        x[_COL["cpu_demand_frac"]] = cpu_f
        x[_COL["mem_demand_frac"]] = mem_f
        x[_COL["cpu_really_used"]] = used_c
        x[_COL["mem_really_used"]] = used_m
        x[_COL["cpu_pred_frac"]] = p_cpu_f
        x[_COL["mem_pred_frac"]] = p_mem_f
        x[_COL["pred_mem_ok"]] = (self.p_res_m >= rec_m - 1e-9).astype(float)
        self._shared_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._n_alive = int(self.alive.sum())
        self._dyn_buf = np.empty((n, len(DYNAMIC)))
        self._dynamic_all(x)
        self.nodes0 = np.ascontiguousarray(x.transpose(1, 2, 0))  # [B, n, F] on the snapshot
        work = WorkLeft()
        priority = np.array([[srpt_priority(work.core_s(t))] for t in tasks], dtype=float)
        self.base = base_action(p_cpu_f, p_mem_f, priority)  # [B, n, 4]: heft_history's action
        self.masks = candidates(v, self.alive, rec_m)  # [B, n]: the nodes each task may take
        self.cluster0 = self._cluster_static(preds, used_c, used_m)
        self.cache = cache if cache is not None else DagCache()
        self.dags, self.dag_of, self.dag_keys = self._dags(self.cache)

    # -- per task, on the view as it is now ---------------------------------------------------

    def take(self, i: int, node: int, cpu: float, mem: float) -> None:
        """Task `i` placed: `ClusterView.take` on the view, as the plain path does."""
        self.view.take(self.tasks[i], node, cpu, mem)
        self.view_changed()

    def view_changed(self) -> None:
        """The view's live load was written (by `take`, or restored by a caller)."""
        self._shared_cache = None

    def _shared(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(cpu used, free memory fraction, queued core-seconds per core) on the view now:
        node features every task shares, recomputed once per placement."""
        if self._shared_cache is None:
            v = self.view
            self._shared_cache = (
                1.0 - v.free_cores * self.inv_c,
                v.free_mem * self.inv_m,
                v.queued_core_s * self.inv_c,
            )
        return self._shared_cache

    def _dynamic(self, i: int) -> np.ndarray:
        """The DYNAMIC node features of task `i` on the view now: [n, len(DYNAMIC)]."""
        v, inv_c = self.view, self.inv_c
        cpu_used, mem_free, queued = self._shared()
        fits = fits_now(v, self.res_c[i], self.res_m[i])
        p_fits = fits_now(v, self.p_res_c[i], self.p_res_m[i])
        cold, transfer = self.cold[i, 0], self.transfer[i]
        p_finish = finish_s(queued, p_fits, self.first_wait, transfer, self.p_compute[i])
        out = self._dyn_buf
        out[:, 0] = cpu_used
        out[:, 1] = mem_free
        out[:, 2] = v.queue_len
        out[:, 3] = queued
        out[:, 4] = (v.free_cores - self.res_c[i]) * inv_c
        out[:, 5] = fits
        out[:, 6] = np.log1p(
            queued + np.where(fits, 0.0, self.compute_mean[i]) + transfer + cold + self.compute[i]
        )
        out[:, 7] = p_fits
        out[:, 8] = np.log1p(p_finish)
        return out

    def _dynamic_all(self, x: np.ndarray) -> None:
        """`_dynamic` of every task on the snapshot, in one pass, written into the DYNAMIC
        planes of `x` [F, B, n] (plane by plane: no [B, n, 9] float64 temporary). (A
        row where this differs in the last bit from `_dynamic` is only recomputed by the
        caller, which compares: the observations themselves come from `_dynamic`.)"""
        v, inv_c = self.view, self.inv_c
        fits = fits_now(v, self.res_c, self.res_m)
        queued = v.queued_core_s * inv_c
        wait = queued + np.where(fits, 0.0, self.compute_mean[:, None])
        p_fits = fits_now(v, self.p_res_c, self.p_res_m)
        p_finish = finish_s(queued, p_fits, self.first_wait, self.transfer, self.p_compute)
        columns = (
            1.0 - v.free_cores * inv_c,
            v.free_mem * self.inv_m,
            v.queue_len,
            queued,
            (v.free_cores - self.res_c) * inv_c,
            fits,
            np.log1p(wait + self.transfer + self.cold + self.compute),
            p_fits,
            np.log1p(p_finish),
        )
        for col, values in zip(DYNAMIC, columns, strict=True):
            x[col] = values  # broadcast over tasks; float32 as astype rounds

    def nodes(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """Task `i`'s node features [n, F] (float32) on the view now, and the rows where they
        differ from the snapshot's (`nodes0[i]`): those the earlier placements changed."""
        dyn = self._dynamic(i).astype(np.float32)
        changed = np.flatnonzero((dyn != self.nodes0[i][:, DYNAMIC]).any(axis=1))
        out = self.nodes0[i].copy()
        if changed.size:
            out[:, DYNAMIC] = dyn
        return out, changed

    def cluster(self, i: int) -> np.ndarray:
        """Task `i`'s cluster features (float32) on the view now. The load aggregates are
        `observe`'s `var` and `mean` written as the reductions numpy runs for them (the same
        pairwise sums, bit for bit), without their Python-level overhead."""
        v, alive = self.view, self.alive
        out = self.cluster0[i].copy()
        if self._n_alive:
            cpu_used, _, queued = self._shared()
            used = cpu_used[alive]
            k = used.size
            mean = np.add.reduce(used, keepdims=True) / k
            dev = used - mean
            np.multiply(dev, dev, out=dev)
            out[0] = np.add.reduce(dev) / k
            out[1] = np.count_nonzero(used <= 1e-9) / k
            out[2] = np.add.reduce(queued[alive]) / k
        # no alive node: observe's var and idle fraction of one zero, no queue wait (0, 1, 0)
        else:
            out[1] = 1.0
        out[3] = np.add.reduce(v.queue_len)
        return out.astype(np.float32)

    def observation(self, i: int, nodes: np.ndarray, cluster: np.ndarray) -> Observation:
        """Task `i`'s `Observation` from its `nodes` and `cluster` features."""
        dag, edges = self.dags[self.dag_of[i]][:2]
        return Observation(
            nodes=nodes,
            mask=self.masks[i].copy(),
            cluster=cluster,
            dag=dag,
            edges=edges,
            task_idx=self.tasks[i].idx,
            base=self.base[i],
            base_logits=finish_logits(nodes[:, FINISH]),
        )

    # -- once per batch -----------------------------------------------------------------------

    def _cluster_static(
        self,
        preds: list[tuple[float, float, float]],
        used_c: np.ndarray,
        used_m: np.ndarray,
    ) -> np.ndarray:
        """Per task, the cluster features that no placement of the batch changes (the first
        four, the load aggregates, are left 0), in float64."""
        v, alive = self.view, self.alive
        any_alive = alive.any()
        alive_frac = float(alive.mean())
        uc = float(used_c[alive].mean()) if any_alive else 0.0
        um = float(used_m[alive].mean()) if any_alive else 0.0
        rows = [
            [0.0, 0.0, 0.0, 0.0, *task_context(t, v.now, pred, alive_frac, uc, um)]
            for t, pred in zip(self.tasks, preds, strict=True)
        ]
        return np.array(rows, dtype=float)

    def _dags(
        self, cache: DagCache
    ) -> tuple[list[tuple[np.ndarray, np.ndarray, TaskView]], np.ndarray, list[DagKey]]:
        """The batch's distinct DAGs as (`dag_features`, edges, a task of it), per task the
        index of its own, and each DAG's key (its workflow and state). Tasks of one workflow
        at one state (the same done and active tasks: siblings of one snapshot) share one,
        read-only: the features do not say which task is placed, so a burst of siblings is
        one DAG to build and encode."""
        dags: list[tuple[np.ndarray, np.ndarray, TaskView]] = []
        index: dict[DagKey, int] = {}
        dag_of = np.empty(len(self.tasks), dtype=np.int64)
        for i, t in enumerate(self.tasks):
            key = (id(t.workflow), np.packbits(t.done).tobytes(), np.packbits(t.active).tobytes())
            k = index.get(key)
            if k is None:
                x, edges = cache.get(t)[:2]
                x = x.copy()
                x[:, _DONE] = t.done
                x[:, _ACTIVE] = t.active
                x.flags.writeable = False
                k = index[key] = len(dags)
                dags.append((x, edges, t))
            dag_of[i] = k
        return dags, dag_of, list(index)


class DagCache:
    """Per workflow, what its DAG encoding's inputs do not owe to where it stands: the
    `dag_features` of any of its tasks (upward ranks included; the done and active columns
    are overwritten per batch) and the edge list both ways with self loops,
    sorted by destination (`in_edges`). Kept across batches for the workflow objects a caller
    keeps (the daemon's workflow cache, the simulator's runs): keyed by the object, which the
    entry holds so its id is not reused; least recently used out beyond `max_rows` task rows
    in all (~120 bytes each, so ~60 MB at the default, whatever the workflows' sizes)."""

    def __init__(self, max_rows: int = 500_000) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self._entries: OrderedDict[int, tuple[Workflow, *tuple[np.ndarray, ...]]] = OrderedDict()

    def get(self, task: TaskView) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(features, edges [2, E], in-edge sources, in-edge destinations) of the task's DAG."""
        wf = task.workflow
        hit = self._entries.get(id(wf))
        if hit is not None and hit[0] is wf:
            self._entries.move_to_end(id(wf))
            x, edges, src, dst = hit[1:]
            return x, edges, src, dst
        x, edges = dag_features(task, upward_rank(wf))
        src, dst = in_edges(wf.size, edges)
        old = self._entries.pop(id(wf), None)  # a workflow gone, its id reused
        if old is not None:
            self.rows -= old[0].size
        self._entries[id(wf)] = (wf, x, edges, src, dst)
        self.rows += wf.size
        while self.rows > self.max_rows and len(self._entries) > 1:
            _, (gone, *_) = self._entries.popitem(last=False)
            self.rows -= gone.size
        return x, edges, src, dst


def in_edges(size: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One DAG's (src, dst) with edges both ways and self loops (as the model's GATv2 layers
    see it), sorted by destination."""
    src = np.concatenate([edges[0], edges[1], np.arange(size)])
    dst = np.concatenate([edges[1], edges[0], np.arange(size)])
    order = np.argsort(dst, kind="stable")
    return src[order], dst[order]
