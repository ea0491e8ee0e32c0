"""Regression adjustment (CUPED / ANCOVA) for the A/B test: what a workflow's outcome owes to
things fixed before its arm could matter.

Most of a workflow's speed is set before any policy touches it: how much slack its deadline
gives over its declared critical path, and how congested the cluster is when it arrives. In
`shift`, these covariates explain about 30% of the speed variance of the champion's workflows
(seed 0, 2,000 workflows; docs/concepts/learning.md). Arms are assigned by a hash of the
workflow id, so the covariates have the same distribution on both arms, and

    y_adj = y - theta . (x - mean(x))

has the same difference in means as `y` for any fixed `theta`, with a variance smaller by the
share of variance `theta . x` explains (Deng et al., *CUPED*, 2013). `theta` is the pooled
within-arm least-squares slope (ridge-stabilised), refitted at every look: the ANCOVA estimate
(Lin, 2013), consistent whatever the true relation; the A/A bench measures the false
promotions it allows.

Covariates (`COVARIATES`) come from the workflow and from the cluster view its first task was
placed from: what the daemon knew before its arm decided anything for it.
"""

from __future__ import annotations

import math

import numpy as np

from dagsched.core.view import ClusterView
from dagsched.core.workflow import Workflow, critical_path_s

COVARIATES: tuple[str, ...] = (
    "log_slack",  # log(deadline / declared critical path)
    "log_critical_path_s",
    # of the cluster when the workflow's first task was placed (its batch's view):
    "idle_fraction",  # alive nodes with no core reserved
    "log_mean_queue_wait_s",  # queued core-seconds per core, mean over alive nodes
    "log_pending",  # tasks queued on nodes
    "cpu_used_mean",  # reserved share of cores, mean over alive nodes
)
MIN_SAMPLES = 30  # per arm before the test adjusts; fewer: the raw outcomes
RIDGE = 1e-3  # x the covariance's mean diagonal

Congestion = tuple[float, float, float, float]  # the four cluster covariates


def congestion(view: ClusterView) -> Congestion:
    """The cluster covariates (`COVARIATES[2:]`) of the view a batch was placed from: in the
    simulator loop the batch's snapshot, in the evaluator the view the daemon logged with it."""
    alive = view.alive.astype(bool)
    if not alive.any():
        return (0.0, 0.0, 0.0, 1.0)
    used = 1.0 - view.free_cores[alive] / view.cores[alive]
    wait = float((view.queued_core_s[alive] / view.cores[alive]).mean())
    return (
        float((used <= 1e-9).mean()),
        math.log1p(max(wait, 0.0)),
        math.log1p(max(float(view.queue_len.sum()), 0.0)),
        float(used.mean()),
    )


def covariates(wf: Workflow, seen: Congestion | None) -> tuple[float, ...] | None:
    """The covariates of `wf`, `seen` being the congestion of the batch its first task was
    placed in; None without it (the test then treats the workflow as average)."""
    if seen is None:
        return None
    cp = max(critical_path_s(wf), 1e-6)
    return (math.log(max(wf.deadline_s, 1e-6) / cp), math.log(cp), *seen)


class Moments:
    """One arm's sums for the adjustment: over workflows with covariates, of x, x x^T, and per
    metric of y, y^2 and x y; over those without, of y and y^2. A verdict costs O(k^2),
    however many workflows the test has seen."""

    def __init__(self, metrics: int, k: int = len(COVARIATES)) -> None:
        self.n_x = 0
        self.s_x = np.zeros(k)
        self.s_xx = np.zeros((k, k))
        self.s_y = np.zeros(metrics)
        self.s_yy = np.zeros(metrics)
        self.s_xy = np.zeros((metrics, k))
        self.n_0 = 0  # without covariates
        self.s0_y = np.zeros(metrics)
        self.s0_yy = np.zeros(metrics)

    def add(self, y: np.ndarray, x: tuple[float, ...] | None) -> None:
        if x is None:
            self.n_0 += 1
            self.s0_y += y
            self.s0_yy += y * y
            return
        xv = np.asarray(x, dtype=float)
        self.n_x += 1
        self.s_x += xv
        self.s_xx += np.outer(xv, xv)
        self.s_y += y
        self.s_yy += y * y
        self.s_xy += np.outer(y, xv)


Stats = tuple[int, float, float]  # n, mean, sum of squared deviations


def adjusted(arms: dict[str, Moments], m: int) -> tuple[dict[str, Stats], float] | None:
    """Per arm, the statistics of metric `m` less its covariates' pooled within-arm fit
    (workflows without covariates left as they are), and the share of the within-arm
    variance the fit explains; None while an arm has fewer than `MIN_SAMPLES` workflows with
    covariates."""
    if any(a.n_x < MIN_SAMPLES for a in arms.values()):
        return None
    k = len(next(iter(arms.values())).s_x)
    gram, cross, total = np.zeros((k, k)), np.zeros(k), 0.0
    for a in arms.values():
        mean_x = a.s_x / a.n_x
        gram += a.s_xx - a.n_x * np.outer(mean_x, mean_x)
        cross += a.s_xy[m] - mean_x * a.s_y[m]
        total += a.s_yy[m] - a.s_y[m] ** 2 / a.n_x
    ridge = RIDGE * float(np.trace(gram)) / k + 1e-12
    theta = np.linalg.solve(gram + ridge * np.eye(k), cross)
    resid = total - 2 * float(theta @ cross) + float(theta @ gram @ theta)
    explained = 1.0 - resid / total if total > 1e-12 else 0.0
    pooled = sum(a.s_x for a in arms.values()) / sum(a.n_x for a in arms.values())
    c = float(theta @ pooled)
    out: dict[str, Stats] = {}
    for arm, a in arms.items():
        # adjusted value: y - theta.x + c with covariates, y without
        sx = float(theta @ a.s_x)
        s1 = a.s_y[m] - sx + a.n_x * c + a.s0_y[m]
        s2 = (
            a.s_yy[m]
            - 2 * float(theta @ a.s_xy[m])
            + float(theta @ a.s_xx @ theta)
            + 2 * c * (a.s_y[m] - sx)
            + a.n_x * c * c
            + a.s0_yy[m]
        )
        n = a.n_x + a.n_0
        mean = s1 / n
        out[arm] = (n, mean, max(s2 - n * mean * mean, 0.0))
    return out, explained
