"""The served fast path's per-task loop, compiled (numba): a batch placed greedily in order.

`fast_place.place_fast` computes, once per batch, the node embedding, the node half of the
scorer and the base part (heft_history's node score) of every distinct (task, node) row
(`distinct_rows`: equal feature rows share them; large matrix products, numpy's BLAS);
`row_of[i, j]` names the row of task i at node j. What must run task by task, in order -
each task seeing the earlier placements - is here, in one compiled call for the whole
batch, with no Python or numpy call per task:

- the nodes earlier placements touched: their DYNAMIC node features recomputed from the
  live load (`BatchObservation._dynamic`'s expressions), normalised and embedded again (the
  node MLP, the scorer's node half, heft_history's score) into the task's own scratch rows;
- the critic's sum of the candidates' embeddings: each distinct row once, times how many
  untouched candidates share it, plus the touched candidates' own rows;
- the four cluster load aggregates on the live load, the context (cluster MLP on them and
  the DAG part), the context's parts of the scorer, continuous head and critic;
- logits as `tanh(node part + context part) @ w + base` (once per distinct row and task),
  masked; the node is the first
  within `TIE_TOL` of the best (`ties.best_node`); its log-softmax;
- the continuous head at that node, the Beta means (anchor + residual) and their log-density
  (`lgamma`), the served values (heft_history's at the node moved by the residual), the
  critic's value; then `ClusterView.take`'s arithmetic on the live load.

Float32 where the model is float32, float64 where the observation is, so the numbers are
the plain forward pass's to float rounding, as the numpy loop's are
(`tests/policy/test_fast_exact.py` checks both). Observations are not built here: the
caller builds them from the placements when they are read (`fast_place.LazyObservations`).

Compiled on first call (`cache=True`: a few seconds once per machine, then loaded from
numba's cache next to this file); importing this module compiles nothing. The kernel calls
nothing outside this file and copies the few constants and formulas it shares with
`fast_place` (the Beta density, the residual, `ANCHOR_FLOOR`, `TIE_TOL`): numba's cache is
invalidated only by changes to this file, so a callee elsewhere could go stale unnoticed; the
tests pin the copies (`test_served_kernel`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

_TIE_TOL = 1e-5  # ties.TIE_TOL (asserted equal by the tests)
_ANCHOR_FLOOR = 0.02  # observation.ANCHOR_FLOOR
_MASKED = np.float32(-1e9)


@njit(cache=True, inline="always")
def _tanh32(x: float) -> np.float32:
    return np.float32(math.tanh(x))


@njit(cache=True, inline="always", error_model="numpy")
def _tanh_rational(x: Any) -> Any:  # float32 in, float32 out (numba types it)
    """tanh in float32 arithmetic, vectorisable (no libm call): Eigen's 13/6 rational
    approximation, within 6 ulp of the true value (numpy's and torch's float32 tanh are
    within 2): the logits move by ~1e-6, well inside `TIE_TOL`."""
    c = np.float32(7.99881172180175781)
    x = min(max(x, -c), c)
    x2 = x * x
    p = x2 * np.float32(-2.76076847742355e-16) + np.float32(2.00018790482477e-13)
    p = x2 * p + np.float32(-8.60467152213735e-11)
    p = x2 * p + np.float32(5.12229709037114e-08)
    p = x2 * p + np.float32(1.48572235717979e-05)
    p = x2 * p + np.float32(6.37261928875436e-04)
    p = x2 * p + np.float32(4.89352455891786e-03)
    p = x * p
    q = x2 * np.float32(1.19825839466702e-06) + np.float32(1.18534705686654e-04)
    q = x2 * q + np.float32(2.26843463243900e-03)
    q = x2 * q + np.float32(4.89352518554385e-03)
    return x if abs(x) < np.float32(0.0004) else p / q


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"}, error_model="numpy")
def _score(part: np.ndarray, r: int, ctx_part: np.ndarray, w: np.ndarray) -> np.float32:
    """tanh(part[r] + ctx_part) @ w: the scorer's output before its bias and the prior (the
    sum over the hidden units in any order: vectorised)."""
    acc = np.float32(0.0)
    for k in range(part.shape[1]):
        acc += _tanh_rational(part[r, k] + ctx_part[k]) * w[k]
    return acc


@njit(cache=True)
def _embed_row(
    xn: np.ndarray,
    w1: np.ndarray,
    b1: np.ndarray,
    w2: np.ndarray,
    b2: np.ndarray,
    h: np.ndarray,
    out: np.ndarray,
) -> None:
    """out = tanh(tanh(xn @ w1 + b1) @ w2 + b2), float32, `h` scratch; the tanh is
    `_tanh_rational` (vectorised: at 32 nodes a batch re-embeds ~1,800 touched rows, and the
    libm tanh was ~20% of the loop), so these rows' embeddings move by ~1e-7 from the batch
    products' and the logits by ~1e-6, inside `TIE_TOL`."""
    hidden = w1.shape[1]
    _matvec(xn, w1, h)
    for k in range(hidden):
        h[k] = _tanh_rational(h[k] + b1[k])
    _matvec(h[:hidden], w2, out)
    for k in range(w2.shape[1]):
        out[k] = _tanh_rational(out[k] + b2[k])


@njit(cache=True, inline="always")
def _matvec(x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
    """out[:w.shape[1]] = x @ w (float32), row by row: the order every product here sums in."""
    for k in range(w.shape[1]):
        out[k] = np.float32(0.0)
    for f in range(x.shape[0]):
        v = x[f]
        for k in range(w.shape[1]):
            out[k] += v * w[f, k]


@njit(cache=True)
def _affine(x: np.ndarray, w: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """out = x @ w + b (float32)."""
    _matvec(x, w, out)
    for k in range(w.shape[1]):
        out[k] += b[k]


@njit(cache=True)
def place_batch(  # one compiled call per batch: its whole state, as arguments
    # live load of the batch's view (written: the placements are taken on it)
    free_c: np.ndarray,
    free_m: np.ndarray,
    qlen: np.ndarray,
    queued_cs: np.ndarray,
    # the cluster's static arrays
    cores: np.ndarray,
    mem_gb: np.ndarray,
    speed: np.ndarray,
    inv_c: np.ndarray,
    inv_m: np.ndarray,
    alive: np.ndarray,
    # per task (BatchObservation)
    res_c: np.ndarray,
    res_m: np.ndarray,
    p_res_c: np.ndarray,
    p_res_m: np.ndarray,
    compute: np.ndarray,
    p_compute: np.ndarray,
    compute_mean: np.ndarray,
    first_wait: np.ndarray,
    transfer: np.ndarray,
    cold: np.ndarray,
    duration: np.ndarray,
    ttype: np.ndarray,
    masks: np.ndarray,
    anchor: np.ndarray,
    base: np.ndarray,
    cluster0: np.ndarray,
    nodes0: np.ndarray,
    dynamic: np.ndarray,
    # normalisation
    n_mean: np.ndarray,
    n_inv: np.ndarray,
    c_mean: np.ndarray,
    c_inv: np.ndarray,
    # the network, split as NumpyNet holds it
    node1_w: np.ndarray,
    node1_b: np.ndarray,
    node2_w: np.ndarray,
    node2_b: np.ndarray,
    sc1_node: np.ndarray,
    sc1_b: np.ndarray,
    sc2_w: np.ndarray,
    sc2_b: np.float32,
    neg_beta: np.float32,
    finish_col: int,
    cl1_cluster: np.ndarray,
    cl1_b: np.ndarray,
    cl2_w: np.ndarray,
    cl2_b: np.ndarray,
    ctx_w: np.ndarray,
    co1_node: np.ndarray,
    co1_b: np.ndarray,
    co2_w: np.ndarray,
    co2_b: np.ndarray,
    cr1_mean: np.ndarray,
    cr1_b: np.ndarray,
    cr2_w: np.ndarray,
    cr2_b: np.float32,
    conc_scale: float,
    low: np.ndarray,
    high: np.ndarray,
    span: np.ndarray,
    # once per batch (fast_place): per (task, node) its distinct row, and per distinct row
    # the node embedding, the scorer's node half and the base part
    row_of: np.ndarray,
    emb: np.ndarray,
    part: np.ndarray,
    prior: np.ndarray,
    count: np.ndarray,
    dag_part: np.ndarray,
    # outputs
    out_node: np.ndarray,
    out_vals: np.ndarray,
    out_unit: np.ndarray,
    out_logp: np.ndarray,
    out_value: np.ndarray,
) -> None:
    b_count, n = res_c.shape
    hdim = node2_w.shape[1]
    n_feat = nodes0.shape[2]
    # the nodes earlier placements touched, in order; their rows for the task at hand
    touched = np.zeros(n, dtype=np.bool_)
    touched_list = np.empty(n, dtype=np.int64)
    slot = np.empty(n, dtype=np.int64)  # a touched node's place in touched_list
    n_touched = 0
    cap = min(n, b_count)
    t_emb = np.empty((cap, hdim), dtype=np.float32)
    t_part = np.empty((cap, hdim), dtype=np.float32)
    t_prior = np.empty(cap, dtype=np.float32)
    # per distinct row: the task that last scored it and that score, the task that last
    # counted it (critic's mean) and how often
    u_count = emb.shape[0]
    scored_by = np.full(u_count, -1, dtype=np.int64)
    score = np.empty(u_count, dtype=np.float32)
    counted_by = np.full(u_count, -1, dtype=np.int64)
    times = np.zeros(u_count, dtype=np.int64)
    seen = np.empty(u_count, dtype=np.int64)
    emb_sum = np.empty(hdim, dtype=np.float64)
    n_alive = 0
    for j in range(n):
        if alive[j]:
            n_alive += 1
    x = np.empty(n_feat, dtype=np.float32)
    xn = np.empty(n_feat, dtype=np.float32)
    h = np.empty(max(node1_w.shape[1], hdim), dtype=np.float32)
    cl_n = np.empty(cluster0.shape[1], dtype=np.float32)
    z1 = np.empty(hdim, dtype=np.float32)
    ctx = np.empty(hdim, dtype=np.float32)
    parts = np.empty(ctx_w.shape[1], dtype=np.float32)
    logits = np.empty(n, dtype=np.float64)
    c_raw = np.empty(co2_w.shape[1], dtype=np.float32)
    mean_emb = np.empty(hdim, dtype=np.float32)
    for i in range(b_count):
        # -- the rows earlier placements changed: features on the live load, embedded again
        for t in range(n_touched):
            j = touched_list[t]
            for f in range(n_feat):
                x[f] = nodes0[i, j, f]
            fits = free_c[j] >= res_c[i, j] - 1e-9 and free_m[j] >= res_m[i, j] - 1e-9
            p_fits = free_c[j] >= p_res_c[i, j] - 1e-9 and free_m[j] >= p_res_m[i, j] - 1e-9
            queued = queued_cs[j] * inv_c[j]
            wait = compute_mean[i] if not fits else 0.0
            p_wait = first_wait[j] if not p_fits else 0.0
            x[dynamic[0]] = np.float32(1.0 - free_c[j] * inv_c[j])
            x[dynamic[1]] = np.float32(free_m[j] * inv_m[j])
            x[dynamic[2]] = np.float32(qlen[j])
            x[dynamic[3]] = np.float32(queued)
            x[dynamic[4]] = np.float32((free_c[j] - res_c[i, j]) * inv_c[j])
            x[dynamic[5]] = np.float32(1.0 if fits else 0.0)
            x[dynamic[6]] = np.float32(
                math.log1p(queued + wait + transfer[i, j] + cold[i] + compute[i, j])
            )
            x[dynamic[7]] = np.float32(1.0 if p_fits else 0.0)
            x[dynamic[8]] = np.float32(
                math.log1p(queued + p_wait + transfer[i, j] + p_compute[i, j])
            )
            for f in range(n_feat):
                v = (x[f] - n_mean[f]) * n_inv[f]
                xn[f] = min(max(v, np.float32(-10.0)), np.float32(10.0))
            _embed_row(xn, node1_w, node1_b, node2_w, node2_b, h, t_emb[t])
            _affine(t_emb[t], sc1_node, sc1_b, t_part[t])
            pr = sc2_b
            pr += neg_beta * x[finish_col]
            t_prior[t] = pr
        # -- the candidates' summed embedding (the critic's mean): each distinct row once,
        # times how many untouched candidates have it, plus the touched candidates' rows
        n_seen = 0
        for j in range(n):
            if masks[i, j] and not touched[j]:
                r = row_of[i, j]
                if counted_by[r] != i:
                    counted_by[r] = i
                    times[r] = 0
                    seen[n_seen] = r
                    n_seen += 1
                times[r] += 1
        for k in range(hdim):
            emb_sum[k] = 0.0
        for q in range(n_seen):
            r = seen[q]
            weight = np.float64(times[r])
            for k in range(hdim):
                emb_sum[k] += weight * np.float64(emb[r, k])
        for t in range(n_touched):
            if masks[i, touched_list[t]]:
                for k in range(hdim):
                    emb_sum[k] += np.float64(t_emb[t, k])
        # -- cluster features on the live load, the context and its parts
        var = 0.0
        idle = 1.0
        mean_q = 0.0
        if n_alive > 0:
            s = 0.0
            sq = 0.0
            n_idle = 0
            for j in range(n):
                if alive[j]:
                    u = 1.0 - free_c[j] * inv_c[j]
                    s += u
                    sq += queued_cs[j] * inv_c[j]
                    if u <= 1e-9:
                        n_idle += 1
            mean = s / n_alive
            for j in range(n):
                if alive[j]:
                    d = (1.0 - free_c[j] * inv_c[j]) - mean
                    var += d * d
            var /= n_alive
            idle = n_idle / n_alive
            mean_q = sq / n_alive
        pending = 0.0
        for j in range(n):
            pending += qlen[j]
        for f in range(cluster0.shape[1]):
            c = cluster0[i, f]
            if f == 0:
                c = var
            elif f == 1:
                c = idle
            elif f == 2:
                c = mean_q
            elif f == 3:
                c = pending
            v = (np.float32(c) - c_mean[f]) * c_inv[f]
            cl_n[f] = min(max(v, np.float32(-10.0)), np.float32(10.0))
        _affine(cl_n, cl1_cluster, cl1_b, z1)
        for k in range(hdim):
            z1[k] = _tanh32(z1[k] + dag_part[i, k])
        _affine(z1, cl2_w, cl2_b, ctx)
        for k in range(hdim):
            ctx[k] = _tanh32(ctx[k])
        _matvec(ctx, ctx_w, parts)
        # -- logits, the node (first within the tie tolerance of the best), its log-softmax
        # (a distinct row scored once per task; a touched node's row is its own)
        top = -np.inf
        for j in range(n):
            lg = np.float64(_MASKED)
            if masks[i, j]:
                if touched[j]:
                    t = slot[j]
                    lg = np.float64(_score(t_part, t, parts[:hdim], sc2_w) + t_prior[t])
                else:
                    r = row_of[i, j]
                    if scored_by[r] != i:
                        scored_by[r] = i
                        score[r] = _score(part, r, parts[:hdim], sc2_w) + prior[r]
                    lg = np.float64(score[r])
            logits[j] = lg
            top = max(top, lg)
        node = 0
        for j in range(n):
            if logits[j] >= top - _TIE_TOL:
                node = j
                break
        total = 0.0
        for j in range(n):
            total += math.exp(logits[j] - top)
        logp = logits[node] - top - math.log(total)
        # -- the continuous head at the node: Beta means, their log-density, served values
        e_node = t_emb[slot[node]] if touched[node] else emb[row_of[i, node]]
        _matvec(e_node, co1_node, h)
        for k in range(hdim):
            h[k] = _tanh32(h[k] + parts[hdim + k] + co1_b[k])
        _affine(h[:hdim], co2_w, co2_b, c_raw)
        for q in range(out_unit.shape[1]):
            a = min(max(np.float64(anchor[i, node, q]), _ANCHOR_FLOOR), 1 - _ANCHOR_FLOOR)
            shift = np.float64(c_raw[2 * q])
            e = math.exp(-abs(shift))  # fast_place._residual: exactly 0 for a zero shift
            up = a * (1.0 - a) * -math.expm1(-abs(shift))
            d = up / (a + (1.0 - a) * e) if shift >= 0 else -up / (1.0 - a + a * e)
            mu = min(max(a + d, 1e-3), 1 - 1e-3)
            kk = np.float64(c_raw[2 * q + 1]) + 2.0
            kappa = conc_scale * (2.0 + (kk if kk > 20.0 else math.log1p(math.exp(kk))))
            al = mu * kappa
            be = (1.0 - mu) * kappa
            u = np.float64(np.float32(min(max(al / (al + be), 1e-4), 1 - 1e-4)))
            out_unit[i, q] = np.float32(u)
            logp += (
                (al - 1.0) * math.log(u)
                + (be - 1.0) * math.log1p(-u)
                + math.lgamma(al + be)
                - math.lgamma(al)
                - math.lgamma(be)
            )
            v = base[i, node, q] + np.float32(d) * span[q]
            out_vals[i, q] = min(max(v, low[q]), high[q])
        out_node[i] = node
        out_logp[i] = logp
        # -- the critic on the context and the candidates' mean embedding
        for k in range(hdim):
            mean_emb[k] = np.float32(emb_sum[k] / count[i])
        _matvec(mean_emb, cr1_mean, h)
        val = cr2_b
        for k in range(hdim):
            val += _tanh32(parts[2 * hdim + k] + h[k] + cr1_b[k]) * cr2_w[k]
        out_value[i] = val
        # -- ClusterView.take on the live load
        cpu = np.float64(out_vals[i, 0])
        mem = np.float64(out_vals[i, 1])
        need_c = cpu * cores[node]
        need_m = mem * mem_gb[node]
        if free_c[node] + 1e-9 >= need_c and free_m[node] + 1e-9 >= need_m:
            free_c[node] -= need_c
            free_m[node] -= need_m
        else:
            qlen[node] += 1
            queued_cs[node] += need_c * duration[i] / speed[node, ttype[i]]
        if not touched[node]:
            touched[node] = True
            touched_list[n_touched] = node
            slot[node] = n_touched
            n_touched += 1
