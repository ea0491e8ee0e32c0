"""The view script's reply, a tab-separated row per node, read as a `ClusterView`: fields in
`VIEW_FIELDS` order, an empty field read as its default."""

from __future__ import annotations

import numpy as np
import pytest

from dagsched.daemon.redis_scripts import VIEW_FIELDS
from dagsched.daemon.redis_state import RedisState
from dagsched.settings import load_settings


def _row(node: str, **values: str) -> str:
    return "\t".join([node, *(values.get(f, "") for f in VIEW_FIELDS)])


def test_rows_become_columns_with_their_defaults():
    s = load_settings()
    rs = RedisState.__new__(RedisState)
    rs.settings = s
    full = {f: "2" for f in VIEW_FIELDS} | {"kind": "gpu", "alive": "1", "zone": "3"}
    text = "\n".join([_row("n-a", **full), _row("n-b", kind="nope", free_mem="7.5")])
    v = rs._view_from(text.encode(), b"12.5")
    assert v.now == 12.5 and v.node_ids == ["n-a", "n-b"]
    assert v.alive.tolist() == [True, False] and v.zone.tolist() == [3, 0]
    assert v.kind[1] == 0 and v.kind[0] != 0
    assert v.cores.tolist() == [2.0, 1.0] and v.net_gbps.tolist() == [2.0, 25.0]
    assert v.free_mem.tolist() == [2.0, 7.5] and v.slowdown.tolist() == [2.0, 1.0]
    assert v.used_cores.tolist() == [0.0, 0.0]  # not read by the script
    gpu = [s.sim.cluster.speed["gpu"].get(t, 1.0) for t in ("cpu", "io", "gpu", "mem")]
    assert np.allclose(v.speed[0], gpu) and v.speed.shape == (2, 4)
    empty = rs._view_from(b"", None)
    assert empty.n == 0 and empty.node_ids == [] and empty.speed.shape == (0, 4)
    with pytest.raises(ValueError, match="shape"):
        rs._view_from(b"n-c\t1", b"0")
