"""`distinct_rows`: equal (task, node) feature rows share one class, unequal ones never do;
and the compiled loop, which embeds each class once, decides as the numpy loop, which
embeds every row, on a batch where most rows are alike."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dagsched.policy import fast_place
from dagsched.policy.bundle import load_bundle
from dagsched.policy.distinct_rows import distinct_rows
from dagsched.policy.vectorised_observation import BatchObservation
from tests.policy.same_decisions import assert_compiled_decided_as
from tests.policy.test_fast_exact import recorded_batch

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


def _check(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    index, first = distinct_rows(x)
    flat = x.reshape(-1, x.shape[-1])
    assert index.shape == x.shape[:-1]
    # every row is its class's first row, bit for bit
    assert np.array_equal(flat[first][index.ravel()].view(np.uint32), flat.view(np.uint32))
    # and the classes' first rows are pairwise different
    assert np.unique(flat[first].view(np.uint32), axis=0).shape[0] == first.size
    return index, first


def test_equal_rows_share_a_class_and_different_rows_do_not() -> None:
    rng = np.random.default_rng(0)
    kinds = rng.standard_normal((7, 25)).astype(np.float32)
    x = kinds[rng.integers(0, 7, size=(64, 300))]  # [64, 300, 25], 7 distinct rows
    x[3, 5, 11] = np.nextafter(x[3, 5, 11], np.float32(np.inf))  # one bit away: its own
    x[9, 0, :] = 0.0
    x[9, 1, :] = 0.0
    x[9, 1, 4] = -0.0  # another bit pattern: a class of its own (a missed saving only)
    index, first = _check(x)
    assert first.size == 7 + 3
    assert index[3, 5] not in np.delete(index.ravel(), 3 * 300 + 5)
    assert index[9, 0] != index[9, 1]


def test_all_rows_distinct_and_all_alike() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((5, 40, 3)).astype(np.float32)
    _, first = _check(x)
    assert first.size == 200
    _, first = _check(np.ones((4, 50, 6), dtype=np.float32))
    assert first.size == 1 and first[0] == 0


def test_the_compiled_loop_on_alike_rows_decides_as_the_numpy_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sched = load_bundle(CHAMPION, "v1", smoke=False)
    view, tasks = recorded_batch(1024, 2, 100)
    obs = BatchObservation(view.batch_copy(), tasks)
    _, first = distinct_rows(obs.nodes0)
    assert first.size < obs.masks.size / 3  # most rows alike: the classes are shared
    with monkeypatch.context() as m:
        m.setattr(fast_place, "_kernel", lambda: None)
        ref = sched.place(view, tasks)
        ref_units, ref_values = sched.last_units, sched.last_values
    got = sched.place(view, tasks)
    assert_compiled_decided_as(sched, got, ref, ref_units, ref_values)
