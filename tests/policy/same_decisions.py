"""One check shared by the served path's tests: the compiled loop decided a batch as the
reference did (numpy loop or plain pass), task by task."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dagsched.core.scheduler import Placement
from dagsched.policy.lazy_observations import LazyObservations
from dagsched.policy.scheduler import GNNScheduler, InOrder


def built(sched: GNNScheduler) -> Sequence[Any]:
    """The observations `sched.place` built, as the path that placed the batch holds them
    (`place` hands them back in the caller's order through an `InOrder` view)."""
    obs = sched.last_observations
    return obs.inner if isinstance(obs, InOrder) else obs


def assert_compiled_decided_as(
    sched: GNNScheduler,
    got: Sequence[Placement],
    ref: Sequence[Placement],
    ref_units: Any,
    ref_values: Any,
) -> None:
    """`got` (just placed by `sched`) came from the compiled loop and equals `ref`."""
    assert isinstance(built(sched), LazyObservations)  # the compiled loop ran
    assert [p.node for p in got] == [p.node for p in ref]
    assert len({p.node for p in got}) > 1
    for p, q in zip(got, ref, strict=True):
        assert p.max_retries == q.max_retries
        assert abs(p.cpu - q.cpu) < 1e-5 and abs(p.mem - q.mem) < 1e-5
        assert abs(p.log_prob - q.log_prob) < 1e-4
    assert np.allclose(sched.last_units, ref_units, atol=1e-5, rtol=0)
    assert np.allclose(sched.last_values, ref_values, atol=1e-4, rtol=0)
