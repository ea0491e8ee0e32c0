"""The distinct rows of a batch's node features, so the node MLP runs once per distinct row.

At 2,048 nodes a batch of 64 tasks has 131,072 (task, node) rows, and on the bench's
cluster only ~23% of them differ: the idle nodes of one kind look the same to a task (the
same load, the same speed, no parent output on them). The rows that differ - a task's
previous node, its parents' nodes, busy nodes, nodes of other kinds - are found by
comparing the features themselves, not by reasoning about which node arrays feed which
column, so whatever `observe` computes, equal rows are equal inputs and share one embedding.

Rows are equal when their float32 bit patterns are (0.0 and -0.0 count as different: only
a missed saving). How much this saves depends on the cluster: a real one whose telemetry
gives every node its own CPU and memory use has few equal rows (the bench's 256-node batch
has none), and then it costs one hash pass over the features (~1 ms at 2,048 nodes).

Compiled on first call (`cache=True`); importing this module compiles nothing.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _distinct(words: np.ndarray, index: np.ndarray, first: np.ndarray) -> int:
    """`words` [R, F] uint32: per row, the index of its class in `index` [R] and each
    class's first row in `first` [<= R]; returns the number of classes. Open addressing
    on a hash of the row, rows compared word by word on a hit."""
    rows, width = words.shape
    size = 1
    while size < 2 * rows:
        size *= 2
    mask = size - 1
    slots = np.full(size, -1, dtype=np.int64)  # a class, or -1
    # the hash: the row's words times odd constants, summed (independent products, not a
    # chain: vectorised), then mixed (the high bits spread down)
    keys = np.empty(width, dtype=np.uint64)
    k = np.uint64(0x9E3779B97F4A7C15)
    for f in range(width):
        k = k * np.uint64(6364136223846793005) + np.uint64(1442695040888963407)
        keys[f] = k | np.uint64(1)
    count = 0
    for r in range(rows):
        h = np.uint64(0)
        for f in range(width):
            h += np.uint64(words[r, f]) * keys[f]
        h ^= h >> np.uint64(32)
        h *= np.uint64(0xD6E8FEB86659FD93)
        h ^= h >> np.uint64(32)
        s = np.int64(h & np.uint64(mask))
        while True:
            c = slots[s]
            if c < 0:
                slots[s] = count
                first[count] = r
                index[r] = count
                count += 1
                break
            q = first[c]
            same = True
            for f in range(width):
                if words[q, f] != words[r, f]:
                    same = False
                    break
            if same:
                index[r] = c
                break
            s = (s + 1) & mask
    return count


def distinct_rows(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For features `x` [..., F] (float32): each row's class [...] (int64) and each class's
    first row as a flat row index [U], so that `x.reshape(-1, F)[first][index] == x`."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, x.shape[-1])
    index = np.empty(flat.shape[0], dtype=np.int64)
    first = np.empty(flat.shape[0], dtype=np.int64)
    count = _distinct(flat.view(np.uint32), index, first)
    return index.reshape(x.shape[:-1]), first[:count].copy()
