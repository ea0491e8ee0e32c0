"""The served fast path: a batch placed in order, each task seeing the earlier placements,
with the network run once per batch and only what a placement changes recomputed.

Per batch (`place_fast`):
1. the observations of every task on the snapshot, vectorised (`BatchObservation`);
2. the DAG encoder over the batch's distinct DAGs, one pass: each workflow once, however
   many of its tasks the batch places (its features do not say which one is placed);
   the DAG half of the cluster MLP's first layer, once;
3. the per-node MLP and the node half of the scorer's first layer for every (task, node)
   pair, as three matrix products; the serving loop runs them once per distinct pair row
   (`distinct_rows`: at 2,048 nodes most idle nodes look alike to a task).

Per task, in order: its node features on the view as the earlier placements left it (only
the features that read free resources and queues), the rows that differ from the snapshot's
re-embedded, its context, logits as `tanh(node part + context part) @ w` plus heft_history's
node scores, the node (argmax, or sampled), the continuous head at that node only (served:
heft_history's values there moved by the head's residual), log-probabilities in closed form
(log softmax; the Beta density by `lgamma`), then `ClusterView.take`. No torch, no distribution
objects. The numbers are the plain forward pass's to float rounding
(`tests/policy/test_fast_exact.py`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import ModuleType

import numpy as np

from dagsched.core.bounds import ACTION_HIGH, ACTION_LOW, UNIT_SPAN, to_unit
from dagsched.core.demand import FINISH_BETA
from dagsched.core.observation import ANCHOR_FLOOR, FINISH, Observation, finish_logits
from dagsched.core.scheduler import Placement
from dagsched.core.ties import best_node
from dagsched.core.view import ClusterView, TaskView
from dagsched.policy.lazy_observations import LazyObservations
from dagsched.policy.model import CONC_SCALE, N_CONT, action_values
from dagsched.policy.numpy_net import F32, NumpyNet, batch_graph
from dagsched.policy.vectorised_observation import DYNAMIC, BatchObservation, DagCache

_MASKED = F32(-1e9)  # as the model's masked_fill


@dataclass
class Placed:
    """A batch's placements and, per task, what the decision was made from."""

    placements: list[Placement] = field(default_factory=list)
    observations: Sequence[Observation] = field(default_factory=list)
    units: list[list[float]] = field(default_factory=list)
    values: list[float] = field(default_factory=list)


def place_fast(
    net: NumpyNet,
    cluster: ClusterView,
    tasks: Sequence[TaskView],
    rng: np.random.Generator | None = None,
    cache: DagCache | None = None,
) -> Placed:
    """Place `tasks` in order on a copy of `cluster`; `rng` None: argmax node and Beta means
    (serving), else sampled with it. `cache` keeps workflows' DAG inputs across batches.
    Serving runs the compiled loop (`greedy_kernel`) where numba is installed."""
    view = cluster.batch_copy()
    if rng is None and (kernel := _kernel()) is not None:
        return _place_in_calls(kernel, net, view, tasks, cache)
    obs = BatchObservation(view, tasks, cache)
    dag_part = _encode(net, obs) @ net.cl1_dag  # [B, H]
    xn = net.normalize("nodes", obs.nodes0)  # [B, n, F]
    emb = net.node_embed(xn)
    part = net.scorer_node_part(emb)
    prior = net.base_part(finish_logits(obs.nodes0[..., FINISH]))  # [B, n]
    masks = obs.masks  # [B, n]: the nodes each task may take
    weight = masks.astype(F32)
    emb_sum = np.einsum("bn,bnh->bh", weight, emb).astype(np.float64)  # [B, H]
    count = np.maximum(1.0, masks.sum(axis=1))
    everywhere: np.ndarray = np.all(masks, axis=1)
    out = Placed()
    seen: list[Observation] = []
    out.observations = seen
    for i in range(len(tasks)):
        nodes, changed = obs.nodes(i)
        if changed.size:  # the rows earlier placements changed: embedded again
            x = net.normalize("nodes", nodes[changed])
            e = net.node_embed(x)
            emb_sum[i] += weight[i, changed] @ (e - emb[i, changed])
            emb[i, changed], part[i, changed] = e, net.scorer_node_part(e)
            prior[i, changed] = net.base_part(finish_logits(nodes[changed, FINISH]))
        cl = obs.cluster(i)
        c_score, c_cont, c_value = net.context_parts(
            net.context(net.normalize("cluster", cl), dag_part[i])
        )
        logits = net.logits(part[i], c_score, prior[i])
        if not everywhere[i]:
            logits = np.where(masks[i], logits, _MASKED)
        node, node_logp = _choose(logits, rng)
        base = obs.base[i, node]
        unit, delta, beta_logp = _continuous(net.cont_raw(emb[i, node], c_cont), to_unit(base), rng)
        cpu, mem, retries, priority = action_values(base, delta, unit, rng is None)
        p = Placement(node, cpu, mem, retries, node_logp + beta_logp, priority)
        out.placements.append(p)
        seen.append(obs.observation(i, nodes, cl))
        out.units.append([float(u) for u in unit])
        out.values.append(net.value(c_value, (emb_sum[i] / count[i]).astype(F32)))
        obs.take(i, p.node, p.cpu, p.mem)
    return out


@functools.cache
def _kernel() -> ModuleType | None:
    """`greedy_kernel`, imported on first use, or None where numba is not installed (the
    numpy loop serves)."""
    try:
        from dagsched.policy import greedy_kernel
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    return greedy_kernel


# Tasks per compiled call. Within a call every task re-embeds the nodes the call's earlier
# placements touched (at 32 nodes, all of them after ~40 tasks), and the call's batch-wide
# products for those rows were spent for nothing; a call that starts from the view the calls
# before it left sees them as its snapshot. So a daemon batch of 256 is placed as four calls:
# the same decisions (each task still sees every earlier placement), less work per task.
CALL_TASKS = 64


def _place_in_calls(
    kernel: ModuleType,
    net: NumpyNet,
    view: ClusterView,
    tasks: Sequence[TaskView],
    cache: DagCache | None,
) -> Placed:
    """The serving loop over `tasks` in compiled calls of `CALL_TASKS`, each on the view the
    calls before it left (`view`, a batch copy, is the first call's snapshot); observations
    built when read."""
    out = Placed()
    calls: list[tuple[BatchObservation, list[Placement]]] = []
    for start in range(0, len(tasks), CALL_TASKS):
        obs = BatchObservation(view, tasks[start : start + CALL_TASKS], cache)
        dag_part = _encode(net, obs) @ net.cl1_dag  # [B, H]
        done, live = _place_compiled(kernel, net, obs, dag_part)
        calls.append((obs, done.placements))
        out.placements += done.placements
        out.units += done.units
        out.values += done.values
        # the next call's snapshot: this one's live load after its placements (`obs.view`
        # stays this call's snapshot, which its lazy observations replay from)
        view = replace(
            view, free_cores=live[0], free_mem=live[1], queue_len=live[2], queued_core_s=live[3]
        )
    out.observations = LazyObservations(*calls)
    return out


def _place_compiled(
    kernel: ModuleType,
    net: NumpyNet,
    obs: BatchObservation,
    dag_part: np.ndarray,
) -> tuple[Placed, list[np.ndarray]]:
    """The serving loop (argmax node, Beta means) in one compiled call, and the live load it
    left (free cores, free memory, queue lengths, queued core-seconds); no observations
    (`obs.view` stays the snapshot). The node MLP, the scorer's node half and the prior run
    once per distinct (task, node) row (`distinct_rows`); the loop reads them through each
    pair's row."""
    from dagsched.policy.distinct_rows import distinct_rows  # numba, as the kernel

    v, b = obs.view, len(obs.tasks)
    row_of, first = distinct_rows(obs.nodes0)
    rows = obs.nodes0.reshape(-1, obs.nodes0.shape[-1])[first]
    emb = net.node_embed(net.normalize("nodes", rows))  # [U, H]
    part = net.scorer_node_part(emb)
    prior = net.base_part(finish_logits(rows[:, FINISH]))  # [U]
    count = np.maximum(1.0, obs.masks.sum(axis=1))
    specs = [t.workflow.tasks[t.idx] for t in obs.tasks]
    f64 = np.float64
    live = [np.array(a, dtype=f64) for a in (v.free_cores, v.free_mem, v.queue_len)]
    live.append(np.array(v.queued_core_s, dtype=f64))
    node = np.empty(b, dtype=np.int64)
    vals = np.empty((b, N_CONT), dtype=F32)
    unit = np.empty((b, N_CONT), dtype=F32)
    logp = np.empty(b, dtype=f64)
    value = np.empty(b, dtype=F32)
    n_mean, n_inv = net.norm["nodes"]
    c_mean, c_inv = net.norm["cluster"]
    c = np.ascontiguousarray
    kernel.place_batch(
        *live,
        c(v.cores, dtype=f64),
        c(v.mem_gb, dtype=f64),
        c(v.speed, dtype=f64),
        c(obs.inv_c, dtype=f64),
        c(obs.inv_m, dtype=f64),
        c(obs.alive),
        c(obs.res_c),
        c(obs.res_m),
        c(obs.p_res_c),
        c(obs.p_res_m),
        c(obs.compute),
        c(obs.p_compute),
        c(obs.compute_mean),
        c(obs.first_wait, dtype=f64),
        c(obs.transfer),
        c(obs.cold[:, 0]),
        np.array([s.duration_s for s in specs], dtype=f64),
        np.array([int(s.type) for s in specs], dtype=np.int64),
        c(obs.masks),
        c(to_unit(obs.base)),
        c(obs.base),
        c(obs.cluster0, dtype=f64),
        obs.nodes0,
        _DYNAMIC,
        n_mean,
        n_inv,
        c_mean,
        c_inv,
        net.node1.w,
        net.node1.b,
        net.node2.w,
        net.node2.b,
        c(net.sc1_node),
        net.sc1_b,
        c(net.sc2.w[:, 0]),
        net.sc2.b[0],
        F32(-FINISH_BETA),
        FINISH,
        c(net.cl1_cluster),
        net.cl1_b,
        net.cl2.w,
        net.cl2.b,
        net.ctx_w,
        c(net.co1_node),
        net.co1_b,
        net.co2.w,
        net.co2.b,
        c(net.cr1_mean),
        net.cr1_b,
        c(net.cr2.w[:, 0]),
        net.cr2.b[0],
        float(CONC_SCALE),
        ACTION_LOW,
        ACTION_HIGH,
        UNIT_SPAN,
        row_of,
        emb,
        part,
        prior,
        count.astype(f64),
        c(dag_part, dtype=F32),
        node,
        vals,
        unit,
        logp,
        value,
    )
    placements = [
        Placement(int(k), float(x[0]), float(x[1]), round(float(x[2])), float(lp), float(x[3]))
        for k, x, lp in zip(node.tolist(), vals, logp.tolist(), strict=True)
    ]
    return Placed(placements, units=unit.tolist(), values=value.tolist()), live


_DYNAMIC = np.array(DYNAMIC, dtype=np.int64)


def _encode(net: NumpyNet, obs: BatchObservation) -> np.ndarray:
    """Per task, its DAG's pooled encoding and its own row of the encoded DAG: [B, 2H].
    The batch's distinct DAGs (`BatchObservation.dags`: siblings share one) that earlier
    batches did not encode (`NumpyNet.encodings`) are encoded in one pass."""
    owners = [t.workflow for _, _, t in obs.dags]
    found = [net.encodings.get(k, wf) for k, wf in zip(obs.dag_keys, owners, strict=True)]
    todo = [k for k, hit in enumerate(found) if hit is None]
    if todo:
        parts = []
        for k in todo:
            src, dst = obs.cache.get(obs.dags[k][2])[2:]
            parts.append((owners[k].size, src, dst))
        graph, firsts = batch_graph(parts)
        dag_x = np.concatenate([obs.dags[k][0] for k in todo])
        pooled, x = net.encode_graphs(dag_x, graph, firsts)
        ends = np.append(firsts[1:], x.shape[0])
        for j, k in enumerate(todo):
            rows = x[firsts[j] : ends[j]]
            net.encodings.put(obs.dag_keys[k], owners[k], pooled[j], rows)
            found[k] = (pooled[j], rows)
    encoded = [hit for hit in found if hit is not None]
    h = net.hidden
    out = np.empty((len(obs.tasks), 2 * h), dtype=F32)
    out[:, :h] = np.stack([p for p, _ in encoded])[obs.dag_of]
    for i, t in enumerate(obs.tasks):
        out[i, h:] = encoded[obs.dag_of[i]][1][t.idx]
    return out


def _choose(logits: np.ndarray, rng: np.random.Generator | None) -> tuple[int, float]:
    """The node (argmax, or sampled) and its log-probability under softmax(logits)."""
    z = logits.astype(np.float64)
    top = z.max()
    ex = np.exp(z - top)
    total = ex.sum()
    if rng is None:
        node = best_node(z, top)
    else:
        cdf = np.cumsum(ex)
        node = int(np.searchsorted(cdf, rng.random() * total, side="right"))
        node = min(node, int(np.flatnonzero(ex > 0)[-1]))
    return node, float(z[node] - top - math.log(total))


def _continuous(
    raw: np.ndarray, anchor: np.ndarray, rng: np.random.Generator | None
) -> tuple[np.ndarray, np.ndarray, float]:
    """The four unit values (Beta means, or samples), the served move of each from its anchor
    (heft_history's value, unit space) and their summed Beta log-density, from the continuous
    head's output at the chosen node, as `ActorCritic.heads` defines them: mean = anchor +
    `model.residual(anchor, shift)`, concentration = CONC_SCALE (2 + softplus(k + 2))."""
    unit = np.empty(N_CONT, dtype=F32)
    delta = np.empty(N_CONT, dtype=F32)
    logp = 0.0
    for j in range(N_CONT):
        a = min(max(float(anchor[j]), ANCHOR_FLOOR), 1 - ANCHOR_FLOOR)
        d = _residual(a, float(raw[2 * j]))
        delta[j] = d
        mean = min(max(a + d, 1e-3), 1 - 1e-3)
        k = float(raw[2 * j + 1]) + 2.0
        kappa = CONC_SCALE * (2.0 + (k if k > 20.0 else math.log1p(math.exp(k))))
        al, be = mean * kappa, (1.0 - mean) * kappa
        u = al / (al + be) if rng is None else float(rng.beta(al, be))
        u = float(np.float32(min(max(u, 1e-4), 1 - 1e-4)))
        unit[j] = u
        logp += (
            (al - 1.0) * math.log(u)
            + (be - 1.0) * math.log1p(-u)
            + math.lgamma(al + be)
            - math.lgamma(al)
            - math.lgamma(be)
        )
    return unit, delta, logp


def _residual(a: float, shift: float) -> float:
    """`model.residual` for one value: exactly 0 for a zero shift."""
    e = math.exp(-abs(shift))
    up = a * (1.0 - a) * -math.expm1(-abs(shift))
    return up / (a + (1.0 - a) * e) if shift >= 0 else -up / (1.0 - a + a * e)
