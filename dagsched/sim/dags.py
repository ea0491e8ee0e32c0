"""Random layered DAG shapes in the classic "daggen" parametrisation, and edge thinning.

`layered_dag` stacks a single entry task, a number of middle layers and a single exit task;
`alpha` sets the shape (small alpha: many thin layers, large alpha: few wide layers) and `beta`
how irregular the layer widths are. Tasks are numbered layer by layer, so every edge goes from
a lower to a higher index and the index order is a topological order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def layer_count(size: int, alpha: float) -> int:
    """Number of layers (entry and exit included) of a `size`-task layered DAG.

    max(3, floor(sqrt(size) / alpha)), capped at `size` so every middle layer has >= 1 task;
    sizes below 3 have `size` layers (a single task, or entry -> exit).
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    if size < 3:
        return size
    return min(size, max(3, math.floor(math.sqrt(size) / alpha)))


def layer_widths(rng: np.random.Generator, size: int, alpha: float, beta: float) -> list[int]:
    """Tasks per layer, summing to `size`: 1 (entry), the middle widths, 1 (exit)."""
    n_layers = layer_count(size, alpha)
    if n_layers < 3:
        return [1] * n_layers
    middle = n_layers - 2
    mid_size = size - 2
    mean = mid_size / middle
    raw = rng.normal(mean, beta * mean, size=middle) if beta > 0 else np.full(middle, mean)
    widths = [max(1, round(float(w))) for w in raw]
    while sum(widths) > mid_size:
        shrinkable = [i for i, w in enumerate(widths) if w > 1]
        widths[shrinkable[int(rng.integers(len(shrinkable)))]] -= 1
    while sum(widths) < mid_size:
        widths[int(rng.integers(middle))] += 1
    return [1, *widths, 1]


def layered_dag(
    rng: np.random.Generator, size: int, max_out: int, alpha: float, beta: float
) -> list[tuple[int, int]]:
    """Edges (parent, child) of a random layered DAG over tasks 0..size-1, sorted.

    Each task links to 1..`max_out` random tasks of the next layer; then each task left
    without a parent gets one random parent from the previous layer. The result has one entry
    (task 0) and one exit (task size-1); every other task has >= 1 parent and >= 1 child.
    """
    if max_out < 1:
        raise ValueError(f"max_out must be >= 1, got {max_out}")
    if beta < 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    widths = layer_widths(rng, size, alpha, beta)
    starts = np.concatenate(([0], np.cumsum(widths))).astype(int).tolist()
    layers = [list(range(starts[k], starts[k + 1])) for k in range(len(widths))]
    edges: set[tuple[int, int]] = set()
    has_parent: set[int] = set()
    for k in range(len(layers) - 1):
        cur, nxt = layers[k], layers[k + 1]
        fans = np.minimum(rng.integers(1, max_out + 1, size=len(cur)), len(nxt)).tolist()
        # a random permutation of the next layer per task; its first `fan` entries are the children
        picks = np.argsort(rng.random((len(cur), len(nxt))), axis=1).tolist()
        for p, fan, row in zip(cur, fans, picks, strict=True):
            for j in row[:fan]:
                edges.add((p, nxt[j]))
                has_parent.add(nxt[j])
    for k in range(1, len(layers)):
        prev = layers[k - 1]
        for c in layers[k]:
            if c not in has_parent:
                edges.add((prev[int(rng.integers(len(prev)))], c))
    return sorted(edges)


def drop_edges(
    rng: np.random.Generator, n: int, edges: Sequence[tuple[int, int]], fraction: float
) -> list[tuple[int, int]]:
    """Remove about `fraction` of `edges` at random, keeping the DAG in one piece.

    An edge is only removed while its child keeps >= 1 other parent and its parent >= 1 other
    child, so entries and exits stay the same and every task still reaches an entry. Fewer
    edges than asked are removed when not enough are removable. Remaining edges keep their
    order.
    """
    if not 0 <= fraction <= 1:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    out_deg = [0] * n
    in_deg = [0] * n
    for p, c in edges:
        if not (0 <= p < n and 0 <= c < n):
            raise ValueError(f"edge ({p}, {c}) refers to a task outside 0..{n - 1}")
        out_deg[p] += 1
        in_deg[c] += 1
    target = round(fraction * len(edges))
    removed: set[int] = set()
    for idx in rng.permutation(len(edges)).tolist():
        if len(removed) >= target:
            break
        p, c = edges[idx]
        if out_deg[p] > 1 and in_deg[c] > 1:
            out_deg[p] -= 1
            in_deg[c] -= 1
            removed.add(idx)
    return [e for i, e in enumerate(edges) if i not in removed]
