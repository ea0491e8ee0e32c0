"""An always-valid sequential A/B test: a normal-mixture SPRT (mSPRT) per metric.

For each metric (higher is better) and each arm we keep a running mean and variance. The
difference `d = mean(challenger) - mean(champion)` has variance `V = s_c^2/n_c + s_b^2/n_b`.
With a N(0, tau^2) mixing prior on the true difference, the mixture likelihood ratio against
"no difference" is (Johari et al., *Always valid inference*, 2017)

    Lambda = sqrt(V / (V + tau^2)) * exp(tau^2 d^2 / (2 V (V + tau^2)))

and `Lambda < 1/a` inverts into a confidence sequence `d +- w` with

    w = sqrt(2 V (V + tau^2) / tau^2 * (log(1/a) + log((V + tau^2) / V) / 2)),

valid at every sample size simultaneously, so the evaluator may look after every outcome.
Each of the three metrics (`METRICS`: SLA met, mean attempt reward, speed) gets
`a = alpha / 3` (Bonferroni), so the chance that an A/A test ever declares any difference is
at most `alpha`. Speed is `-log(JCT / deadline)`: SLA's continuous version, which tells a
challenger that finishes workflows 10% sooner from the champion in a fraction of the
workflows a pass/fail count needs (experiments/judge_power.py).

With `adjust` (the default), each metric is first regression-adjusted on covariates fixed before
the arm could matter: the workflow's slack and the cluster's congestion at its first decision
(`dagsched.learner.adjustment`); the test then runs on the adjusted outcomes, whose difference in
means is the same and whose variance is smaller by what the covariates explain.

The rule (`decide`), checked only once both arms have `min_samples`:

- promote: some metric's interval lies above 0 and its estimate is at least its minimum
  effect, and no metric's interval lies below 0;
- retire: some metric's interval lies below 0 (worse), or every metric's interval lies
  below its minimum effect (futile), or the challenger has `max_samples` (budget);
- otherwise continue.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from dagsched.learner.adjustment import COVARIATES, Moments, adjusted

Decision = Literal["promote", "retire", "continue"]
METRICS: tuple[str, ...] = ("sla", "reward", "speed")


@dataclass
class Running:
    """Welford's running mean and variance of one metric on one arm."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (x - self.mean)

    @property
    def var(self) -> float:
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0


@dataclass(frozen=True)
class DecisionRule:
    """The decision rule's parameters (printed in every verdict)."""

    alpha: float = 0.05
    min_samples: int = 100
    max_samples: int = 5000
    tau: dict[str, float] = field(
        default_factory=lambda: {"sla": 0.05, "reward": 0.05, "speed": 0.1}
    )
    min_effect: dict[str, float] = field(
        default_factory=lambda: {"sla": 0.02, "reward": 0.01, "speed": 0.03}
    )
    var_floor: float = 1e-4  # keeps V > 0 while an arm's outcomes are all equal
    adjust: bool = True  # regression adjustment on the workflows' covariates

    def describe(self) -> str:
        adjust = f", adjusted on {', '.join(COVARIATES)}" if self.adjust else ""
        return (
            f"mSPRT (normal mixture) per metric, alpha={self.alpha:g} split over "
            f"{len(METRICS)} metrics, min_samples={self.min_samples}, "
            f"max_samples={self.max_samples}, tau={self.tau}, min_effect={self.min_effect}"
            f"{adjust}"
        )


@dataclass
class MetricStats:
    """One metric's comparison at the time of a verdict."""

    n_champion: int
    n_challenger: int
    mean_champion: float
    mean_challenger: float
    diff: float
    lower: float
    upper: float
    log_lambda: float
    explained: float = 0.0  # share of the outcome's variance the covariates removed


@dataclass
class Verdict:
    """What the test says now, why, and the statistics behind it."""

    decision: Decision
    reason: str
    rule: str
    stats: dict[str, MetricStats]

    def to_dict(self) -> dict[str, Any]:
        return {
            "decision": self.decision,
            "reason": self.reason,
            "rule": self.rule,
            "stats": {k: asdict(v) for k, v in self.stats.items()},
        }


def compare(
    champion: Running, challenger: Running, tau: float, alpha: float, var_floor: float
) -> MetricStats:
    """The confidence sequence and mixture statistic for one metric."""
    d = challenger.mean - champion.mean
    nb, nc = max(champion.n, 1), max(challenger.n, 1)
    v = max(champion.var, var_floor) / nb + max(challenger.var, var_floor) / nc
    log_lambda, w = mixture(d, v, tau, alpha)
    return MetricStats(
        champion.n, challenger.n, champion.mean, challenger.mean, d, d - w, d + w, log_lambda
    )


def mixture(d: float, v: float, tau: float, alpha: float) -> tuple[float, float]:
    """(log Lambda, half-width of the confidence sequence) of an estimate `d` with variance
    `v` under a N(0, tau^2) mixing prior (the module docstring's formulas)."""
    t2 = tau * tau
    log_lambda = 0.5 * math.log(v / (v + t2)) + t2 * d * d / (2 * v * (v + t2))
    w = math.sqrt(2 * v * (v + t2) / t2 * (math.log(1 / alpha) + 0.5 * math.log((v + t2) / v)))
    return log_lambda, w


def decide(
    champion: dict[str, Running], challenger: dict[str, Running], rule: DecisionRule
) -> Verdict:
    """Promote, retire or continue, by the rule in the module docstring."""
    a = rule.alpha / len(METRICS)
    stats = {
        m: compare(champion[m], challenger[m], rule.tau[m], a, rule.var_floor) for m in METRICS
    }
    n = min(min(champion[m].n, challenger[m].n) for m in METRICS)
    spent = max(challenger[m].n for m in METRICS)
    return _by_rule(stats, rule, n, spent, "samples per arm", "samples")


def _by_rule(
    stats: dict[str, Any],
    rule: Any,
    n: int,
    spent: int,
    enough: str,
    budget: str,
    futility: bool = True,
) -> Verdict:
    """The rule of the module docstring on per-metric intervals `stats`: `n` samples seen
    (against `rule.min_samples`, counted as `enough` says), `spent` of the budget; no
    futility retirement unless `futility`."""
    text = rule.describe()
    if n < rule.min_samples:
        return Verdict("continue", f"fewer than {rule.min_samples} {enough}", text, stats)
    worse = [m for m, s in stats.items() if s.upper < 0]
    if worse:
        return Verdict("retire", f"challenger worse on {', '.join(worse)}", text, stats)
    better = [m for m, s in stats.items() if s.lower > 0 and s.diff >= rule.min_effect[m]]
    if better:
        return Verdict("promote", f"challenger better on {', '.join(better)}", text, stats)
    if futility and all(s.upper < rule.min_effect[m] for m, s in stats.items()):
        return Verdict("retire", "futile: cannot reach the minimum effect", text, stats)
    if spent >= rule.max_samples:
        return Verdict("retire", f"budget of {rule.max_samples} {budget} spent", text, stats)
    return Verdict("continue", "no decision yet", text, stats)


ARMS: tuple[str, ...] = ("champion", "challenger")


class ABTest:
    """Outcomes per arm, fed one unit (a workflow) at a time, with its covariates (None when
    unknown: the workflow then counts as average for the adjustment)."""

    def __init__(self, rule: DecisionRule) -> None:
        self.rule = rule
        self.arms: dict[str, dict[str, Running]] = {
            arm: {m: Running() for m in METRICS} for arm in ARMS
        }
        self.moments = {arm: Moments(len(METRICS)) for arm in ARMS}

    def add(
        self,
        arm: str,
        sla: float,
        reward: float,
        speed: float,
        covariates: tuple[float, ...] | None = None,
    ) -> None:
        metrics = self.arms[arm]
        metrics["sla"].add(sla)
        metrics["reward"].add(reward)
        metrics["speed"].add(speed)
        if self.rule.adjust:
            self.moments[arm].add(np.array([sla, reward, speed]), covariates)

    def adjusted_arms(self) -> tuple[dict[str, dict[str, Running]], dict[str, float]]:
        """Per arm and metric the statistics the test runs on, and per metric the share of
        variance the adjustment removed (the raw statistics, 0, until it can adjust)."""
        if not self.rule.adjust:
            return self.arms, {m: 0.0 for m in METRICS}
        arms: dict[str, dict[str, Running]] = {arm: {} for arm in ARMS}
        explained = {}
        for k, m in enumerate(METRICS):
            fit = adjusted(self.moments, k)
            explained[m] = fit[1] if fit is not None else 0.0
            for arm in ARMS:
                arms[arm][m] = Running(*fit[0][arm]) if fit is not None else self.arms[arm][m]
        return arms, explained

    def verdict(self) -> Verdict:
        arms, explained = self.adjusted_arms()
        v = decide(arms["champion"], arms["challenger"], self.rule)
        for m, stats in v.stats.items():
            stats.explained = explained[m]
        return v


# -- the paired test: one difference per replay ------------------------------------------------

PAIRED_METRICS: tuple[str, ...] = ("jct", "sla", "reward")


@dataclass(frozen=True)
class PairedRule:
    """The paired test's parameters. A sample is one replay's difference, challenger minus
    champion, higher better: `jct` is the relative reduction of mean JCT, (champion -
    challenger) / champion; `sla` the SLA attainment; `reward` the mean attempt reward."""

    alpha: float = 0.05
    min_samples: int = 16
    max_samples: int = 400
    min_windows: int = 2  # windows before any verdict: no verdict on one stretch of traffic
    # windows before a futility retirement: the first windows follow a cold start, where a
    # change that relieves congestion has had no backlog to relieve yet, so their gain
    # understates the steady one; waiting costs replays, retiring early costs the version
    min_windows_futile: int = 4
    tau: dict[str, float] = field(
        default_factory=lambda: {"jct": 0.05, "sla": 0.03, "reward": 0.02}
    )
    min_effect: dict[str, float] = field(
        default_factory=lambda: {"jct": 0.02, "sla": 0.01, "reward": 0.005}
    )
    var_floor: float = 1e-6  # keeps V > 0 when every difference is equal (identical policies)
    # what the test's variance is taken from (`compare_paired`): "replays", the spread of the
    # per-replay differences (the gain on the traffic seen: windows are fixed, replays are
    # the samples), or "windows", the larger of that and the spread between the windows'
    # means (the gain on traffic like it: windows are samples too)
    variance: Literal["replays", "windows"] = "replays"

    def describe(self) -> str:
        spread = {
            "replays": "variance of the per-replay differences",
            "windows": "variance the larger of per-replay and between-window",
        }[self.variance]
        return (
            f"paired mSPRT (normal mixture) on per-replay differences, alpha={self.alpha:g} "
            f"split over {len(PAIRED_METRICS)} metrics, {spread}, "
            f"min_samples={self.min_samples}, "
            f"min_windows={self.min_windows}, min_windows_futile={self.min_windows_futile}, "
            f"max_samples={self.max_samples}, "
            f"tau={self.tau}, min_effect={self.min_effect}"
        )


def compare_paired(
    diffs: Running, windows: Running | None, tau: float, alpha: float, var_floor: float
) -> MetricStats:
    """One metric's confidence sequence on the mean of paired differences; the champion's
    side of `MetricStats` is 0 and the challenger's is the mean difference. The variance of
    the mean is s^2/n over the replays; given the windows' means (`windows`), the larger of
    that and s_w^2/G over the G windows.

    The two answer different questions. Replays of one window share its workflows, so the
    replays alone measure the gain on the traffic seen: under the null that the challenger
    changes nothing on it, each window's replays have mean 0 and the per-replay spread is
    the whole of the noise. The spread between windows adds how much the gain itself moves
    from one stretch of traffic to the next (a congestion gain is nil while the cluster
    fills and largest at its peak), which matters to a claim about traffic not yet seen."""
    n = max(diffs.n, 1)
    v = max(diffs.var, var_floor) / n
    if windows is not None and windows.n > 1:
        v = max(v, windows.var / windows.n)
    log_lambda, w = mixture(diffs.mean, v, tau, alpha)
    d = diffs.mean
    return MetricStats(diffs.n, diffs.n, 0.0, d, d, d - w, d + w, log_lambda)


class PairedTest:
    """The mSPRT on paired differences, fed one window's replays at a time. Under the null
    the differences have mean 0 whatever else they share (a window, the world's draws), so
    the mixture is a martingale and the test may look after every window. Replays of
    different windows use different seeds, so no two share their draws."""

    def __init__(self, rule: PairedRule) -> None:
        self.rule = rule
        self.diffs = {m: Running() for m in PAIRED_METRICS}
        self.windows = {m: Running() for m in PAIRED_METRICS}  # each window's mean difference

    @property
    def n(self) -> int:
        return self.diffs["jct"].n

    def add(self, diffs: dict[str, float]) -> None:
        """One replay that is its own window (independent of every other)."""
        self.add_window([diffs])

    def add_window(self, replays: Sequence[dict[str, float]]) -> None:
        """The differences of one window's replays."""
        if not replays:
            return
        for m in PAIRED_METRICS:
            xs = [float(d[m]) for d in replays]
            for x in xs:
                self.diffs[m].add(x)
            self.windows[m].add(sum(xs) / len(xs))

    def verdict(self) -> Verdict:
        """Promote, retire or continue, by `decide`'s rule over the paired metrics."""
        rule = self.rule
        a = rule.alpha / len(PAIRED_METRICS)
        between = rule.variance == "windows"
        stats = {}
        for m in PAIRED_METRICS:
            windows = self.windows[m] if between else None
            stats[m] = compare_paired(self.diffs[m], windows, rule.tau[m], a, rule.var_floor)
        if self.windows["jct"].n < rule.min_windows:
            n = self.windows["jct"].n
            return Verdict("continue", f"fewer than {rule.min_windows} windows ({n})",
                           rule.describe(), stats)  # fmt: skip
        futility = self.windows["jct"].n >= rule.min_windows_futile
        return _by_rule(stats, rule, self.n, self.n, "replays", "replays", futility)
