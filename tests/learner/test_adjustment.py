"""Regression adjustment: the closed form from sums equals the fit on the samples, and the
covariates are read from the workflow and its first observation."""

from __future__ import annotations

import math

import numpy as np

from dagsched.core.view import ClusterView
from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.learner.adjustment import (
    COVARIATES,
    MIN_SAMPLES,
    RIDGE,
    Moments,
    adjusted,
    congestion,
    covariates,
)


def _direct(y: dict[str, np.ndarray], x: dict[str, np.ndarray]) -> tuple[dict[str, tuple], float]:
    """The adjustment computed on the samples: pooled within-arm ridge least squares."""
    cx = np.concatenate([x[a][~np.isnan(x[a][:, 0])] - np.nanmean(x[a], axis=0) for a in x])
    cy = np.concatenate(
        [y[a][~np.isnan(x[a][:, 0])] - y[a][~np.isnan(x[a][:, 0])].mean() for a in x]
    )
    gram = cx.T @ cx
    ridge = RIDGE * np.trace(gram) / len(gram)
    theta = np.linalg.solve(gram + ridge * np.eye(len(gram)), cx.T @ cy)
    explained = 1 - ((cy - cx @ theta) ** 2).sum() / (cy**2).sum()
    pooled = np.concatenate([x[a][~np.isnan(x[a][:, 0])] for a in x]).mean(axis=0)
    out = {}
    for a in x:
        has = ~np.isnan(x[a][:, 0])
        v = y[a].copy()
        v[has] -= (x[a][has] - pooled) @ theta
        out[a] = (len(v), v.mean(), ((v - v.mean()) ** 2).sum())
    return out, explained


def test_the_sums_give_the_fit_on_the_samples() -> None:
    rng = np.random.default_rng(0)
    k = len(COVARIATES)
    beta = rng.normal(size=k)
    y, x, moments = {}, {}, {}
    for arm, n in (("champion", 300), ("challenger", 120)):
        xa = rng.normal(size=(n, k)) + (0.3 if arm == "challenger" else 0.0)
        ya = xa @ beta + rng.normal(size=n)
        xa[rng.random(n) < 0.1] = np.nan  # some workflows without covariates
        y[arm], x[arm] = ya, xa
        moments[arm] = Moments(metrics=1)
        for yi, xi in zip(ya, xa, strict=True):
            moments[arm].add(np.array([yi]), None if np.isnan(xi[0]) else tuple(xi))
    fit = adjusted(moments, 0)
    assert fit is not None
    stats, explained = fit
    want, want_explained = _direct(y, x)
    for arm in y:
        n, mean, m2 = stats[arm]
        assert n == want[arm][0]
        assert math.isclose(mean, want[arm][1], rel_tol=1e-4, abs_tol=1e-6)
        assert math.isclose(m2, want[arm][2], rel_tol=1e-3)
    assert math.isclose(explained, want_explained, rel_tol=1e-6) and explained > 0.3


def test_no_adjustment_before_each_arm_has_enough_workflows_with_covariates() -> None:
    moments = {arm: Moments(metrics=1) for arm in ("champion", "challenger")}
    for i in range(MIN_SAMPLES - 1):
        for m in moments.values():
            m.add(np.array([float(i)]), (float(i),) * len(COVARIATES))
    assert adjusted(moments, 0) is None


def four_nodes() -> ClusterView:
    """Three alive nodes (one idle, one half used, one full with 9 queued tasks), one dead."""
    n = 4
    return ClusterView(
        now=0.0,
        node_ids=[f"n{i}" for i in range(n)],
        kind=np.zeros(n, dtype=int),
        zone=np.zeros(n, dtype=int),
        cores=np.full(n, 8.0),
        mem_gb=np.full(n, 32.0),
        gpu_mem_gb=np.zeros(n),
        net_gbps=np.ones(n),
        speed=np.ones((n, 4)),
        alive=np.array([True, True, True, False]),
        free_cores=np.array([8.0, 4.0, 0.0, 8.0]),
        free_mem=np.full(n, 32.0),
        queue_len=np.array([0.0, 0.0, 9.0, 0.0]),
        queued_core_s=np.array([0.0, 0.0, 240.0, 0.0]),
        net_in_bytes=np.zeros(n),
        failure_rate=np.zeros(n),
        slowdown=np.ones(n),
    )


def test_covariates_read_slack_and_congestion() -> None:
    spec = TaskSpec("t", TaskType.CPU, 100.0, 1.0, 1.0)
    wf = Workflow.build("w", [spec, spec], [(0, 1)], deadline_s=600.0)
    x = covariates(wf, congestion(four_nodes()))
    assert x is not None and len(x) == len(COVARIATES)
    got = dict(zip(COVARIATES, x, strict=True))
    assert math.isclose(got["log_slack"], math.log(600.0 / 200.0), rel_tol=1e-6)
    assert math.isclose(got["idle_fraction"], 1 / 3)  # the dead node does not count
    assert math.isclose(got["log_mean_queue_wait_s"], math.log1p(10.0))
    assert math.isclose(got["log_pending"], math.log(10.0))
    assert math.isclose(got["cpu_used_mean"], 0.5)
    assert covariates(wf, None) is None
