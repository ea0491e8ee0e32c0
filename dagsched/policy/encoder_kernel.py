"""The DAG encoder's per-edge and per-row sums, compiled (numba).

`gat_edges`: a GATv2 layer's edge work: scores, segment softmax and weighted sums.

`numpy_net.Gat` computes the layer's two linear maps with numpy (BLAS); what is left is per
edge and per destination: the edge score `att . leaky_relu(x_l[src] + x_r[dst])` per head,
the softmax of the scores over each destination's in-edges (PyG's, with its 1e-16), and the
attention-weighted sum of the sources' `x_l`, averaged over the heads. In numpy that is a
dozen calls and as many [E, heads, C] temporaries, ~0.4 ms a batch whatever its size (a
daemon batch at 1,000 tasks/s holds a few workflows); here it is one pass over the edges,
destination by destination. Float32 as the torch layer; sums run in edge order, so the
numbers agree with PyG's to float rounding (`tests/policy/test_fast_exact.py`).

`pool_rows`: the attention pooling's weighted sum of each DAG's rows (numpy's `reduceat`
along rows is ~20x slower than this loop; a scipy sparse product spends ~70 us checking its
input).

Compiled on first call (`cache=True`); importing this module compiles nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy", fastmath={"reassoc", "contract", "nsz"})
def gat_edges(
    xl: np.ndarray,  # [T, heads, C] float32: the left map of every node (the sources' side)
    xr: np.ndarray,  # [T, heads, C] float32: the right map (the destinations' side)
    src: np.ndarray,  # [E] int64: each edge's source, edges sorted by destination
    starts: np.ndarray,  # [T] int64: each destination's first in-edge (none has zero)
    att: np.ndarray,  # [heads, C] float32
    neg_slope: np.float32,
    out: np.ndarray,  # [T, C] float32, written: the heads' mean (before the bias)
) -> None:
    t_count, heads, c_count = xl.shape
    e_count = src.size
    top = np.empty(heads, dtype=np.float32)
    total = np.empty(heads, dtype=np.float32)
    alpha = np.empty((e_count, heads), dtype=np.float32)
    inv_heads = np.float32(1.0) / np.float32(heads)
    for i in range(t_count):
        lo = starts[i]
        hi = starts[i + 1] if i + 1 < t_count else e_count
        for k in range(heads):
            top[k] = -np.inf
            total[k] = np.float32(0.0)
        for jj in range(lo, hi):
            j = src[jj]
            for k in range(heads):
                acc = np.float32(0.0)
                for c in range(c_count):
                    e = xl[j, k, c] + xr[i, k, c]
                    acc += att[k, c] * max(e, e * neg_slope)
                alpha[jj, k] = acc
                if acc > top[k]:
                    top[k] = acc
        for jj in range(lo, hi):
            for k in range(heads):
                ex = np.float32(np.exp(alpha[jj, k] - top[k]))
                alpha[jj, k] = ex
                total[k] += ex
        for k in range(heads):
            total[k] += np.float32(1e-16)  # PyG's, against an empty sum
        for c in range(c_count):
            out[i, c] = np.float32(0.0)
        for k in range(heads):
            acc_row = out[i]
            for jj in range(lo, hi):
                w = alpha[jj, k] / total[k]
                j = src[jj]
                for c in range(c_count):
                    acc_row[c] += w * xl[j, k, c]
        for c in range(c_count):
            out[i, c] *= inv_heads


@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
def pool_rows(w: np.ndarray, x: np.ndarray, firsts: np.ndarray, out: np.ndarray) -> None:
    """out[d] = sum of w[r] * x[r] over DAG d's rows (`firsts`: each DAG's first row; the
    rows of a DAG are contiguous), in row order."""
    d_count = firsts.size
    for d in range(d_count):
        lo = firsts[d]
        hi = firsts[d + 1] if d + 1 < d_count else x.shape[0]
        row = out[d]
        for c in range(x.shape[1]):
            row[c] = np.float32(0.0)
        for r in range(lo, hi):
            v = w[r]
            for c in range(x.shape[1]):
                row[c] += v * x[r, c]
