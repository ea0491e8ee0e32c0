"""The compiled serving loop (`greedy_kernel`) against the numpy loop it replaces, and the
observations it leaves to be built when read (`LazyObservations`).

`test_fast_exact.py` holds both paths to the plain forward pass; here: the compiled loop
decides as the numpy loop does, task by task, whether the batch is one compiled call or
several (`fast_place.CALL_TASKS`: each call starts from the view the calls before it left);
the lazy observations are `observe`'s, read in any order, across calls; the kernel's tanh
stays within its stated error; its copies of shared constants match their sources.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dagsched.core.heft import heft_order
from dagsched.core.observation import ANCHOR_FLOOR, Observation, observe
from dagsched.core.ties import TIE_TOL
from dagsched.core.view import ClusterView, TaskView
from dagsched.policy import fast_place, greedy_kernel
from dagsched.policy.bundle import load_bundle
from dagsched.policy.lazy_observations import LazyObservations
from dagsched.policy.scheduler import GNNScheduler
from tests.policy.residual_models import random_model
from tests.policy.same_decisions import assert_compiled_decided_as, built
from tests.policy.test_fast_exact import recorded_batch

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


@pytest.fixture(scope="module", params=["champion", "random residual"])
def champion(request: pytest.FixtureRequest) -> GNNScheduler:
    """The shipped champion, and a model whose residual layers are random (an untrained
    residual is zero: the network's arithmetic would not show in its decisions)."""
    shipped = load_bundle(CHAMPION, "v1", smoke=False)
    if request.param == "champion":
        return shipped
    return GNNScheduler(random_model(11), shipped.normalizer, "random")


@pytest.fixture(scope="module")
def batch() -> tuple[ClusterView, list[TaskView]]:
    return recorded_batch(32, 3, 150, faults=True, dead=3)


@pytest.fixture(params=[None, 7], ids=["one call", "calls of 7"])
def calls(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int | None:
    """The batch (48 tasks) placed in one compiled call, or in calls of 7 tasks."""
    if request.param is not None:
        monkeypatch.setattr(fast_place, "CALL_TASKS", request.param)
    return request.param


def _numpy_loop(
    sched: GNNScheduler, view: ClusterView, tasks: list[TaskView], monkeypatch: pytest.MonkeyPatch
) -> tuple[list, list[Observation], list[list[float]], list[float]]:
    with monkeypatch.context() as m:
        m.setattr(fast_place, "_kernel", lambda: None)
        placed = sched.place(view, tasks)
    assert isinstance(built(sched), list)  # the numpy loop builds them eagerly
    return placed, list(sched.last_observations), sched.last_units, sched.last_values


def _same(a: Observation, b: Observation) -> None:
    assert a.task_idx == b.task_idx
    for f in ("nodes", "mask", "cluster", "dag", "edges", "base", "base_logits"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


def test_the_compiled_loop_decides_as_the_numpy_loop(
    champion: GNNScheduler,
    batch: tuple[ClusterView, list[TaskView]],
    monkeypatch: pytest.MonkeyPatch,
    calls: int | None,
) -> None:
    view, tasks = batch
    ref, _, ref_units, ref_values = _numpy_loop(champion, view, tasks, monkeypatch)
    got = champion.place(view, tasks)
    assert_compiled_decided_as(champion, got, ref, ref_units, ref_values)


def test_lazy_observations_are_observes_in_any_order(
    champion: GNNScheduler, batch: tuple[ClusterView, list[TaskView]], calls: int | None
) -> None:
    view, tasks = batch
    free = view.free_cores.copy()
    placed = champion.place(view, tasks)
    lazy = champion.last_observations
    # observe() with the earlier placements taken (the reservations are the compiled loop's:
    ref_view = view.batch_copy()  # the numpy loop's differ in the last bit)
    eager: dict[int, Observation] = {}
    for i in heft_order(tasks):  # the order the batch is placed in: heft_history's
        t, p = tasks[i], placed[i]
        eager[i] = observe(ref_view, t)
        ref_view.take(t, p.node, p.cpu, p.mem)
    eager_in_order = [eager[i] for i in range(len(tasks))]
    assert isinstance(built(champion), LazyObservations) and len(lazy) == len(tasks)
    order = [len(tasks) - 1, 0, 5, 3, len(tasks) // 2, -1]  # backwards restarts the replay
    for k in order:
        _same(lazy[k], eager_in_order[k])
    assert lazy[5] is lazy[5]  # built once
    for a, b in zip(lazy[2:9:3], eager_in_order[2:9:3], strict=True):
        _same(a, b)
    for a, b in zip(lazy, eager_in_order, strict=True):
        _same(a, b)
    assert np.array_equal(view.free_cores, free)  # the caller's view is not written
    with pytest.raises(IndexError):
        lazy[len(tasks)]


def test_the_kernels_tanh_is_within_six_ulp() -> None:
    x = np.concatenate(
        [
            np.linspace(-12, 12, 200_001, dtype=np.float32),
            np.geomspace(1e-8, 1e-2, 1_001).astype(np.float32),
            np.float32([0.0, -0.0, 4e-4, -4e-4]),
        ]
    )
    got = np.array([greedy_kernel._tanh_rational(v) for v in x[::50]], dtype=np.float32)
    x = x[::50]
    true = np.tanh(x.astype(np.float64))
    ulp = np.spacing(np.abs(true).astype(np.float32)).astype(np.float64)
    assert np.all(np.abs(got - true) <= 6 * ulp)


def test_the_kernels_constants_are_their_sources() -> None:
    assert greedy_kernel._TIE_TOL == TIE_TOL
    assert greedy_kernel._ANCHOR_FLOOR == ANCHOR_FLOOR
