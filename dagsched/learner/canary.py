"""The canary: a challenger's live slice as a non-inferiority guardrail.

With the replay judge deciding promotion, the per-workflow A/B on the live slice promotes
nothing: both arms sit in the congestion the champion makes, so it cannot see what a change
is worth to the whole cluster. It still sees what the slice's own workflows go through, and
that is what a canary is for:

- worse: for some metric the slice is significantly worse than the champion by more than
  its margin (the confidence sequence's upper end of challenger - champion is below
  -margin): the challenger is retired at once, whatever the replay says;
- clean: the slice has served `min_workflows` workflows and is not worse: a replay win may
  promote it;
- waiting: otherwise, and always while either arm has fewer than `min_workflows`.

The statistics are the A/B test's own (`sequential.ABTest`: always-valid confidence
sequences, regression-adjusted), so the canary may be checked after every workflow.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dagsched.learner.sequential import METRICS, ABTest, Verdict, compare

Status = Literal["waiting", "clean", "worse"]


@dataclass(frozen=True)
class CanaryRule:
    """How much of the slice a replay win needs, and how much worse it may look."""

    min_workflows: int = 50
    # per metric the A/B test keeps (`sequential.METRICS`) that the canary watches
    margin: dict[str, float] = field(default_factory=lambda: {"sla": 0.05, "speed": 0.05})

    def describe(self) -> str:
        return f"canary: min_workflows={self.min_workflows}, margin={self.margin}"


@dataclass
class CanaryCheck:
    """The canary now, and the statistics behind it (a `Verdict` whose decision is
    `retire` when worse, `continue` otherwise)."""

    status: Status
    workflows: int  # the challenger's, judged
    verdict: Verdict


def check(test: ABTest, rule: CanaryRule) -> CanaryCheck:
    """Waiting, clean or worse (the module docstring) for the slice `test` has seen."""
    arms, explained = test.adjusted_arms()
    ab = test.rule
    a = ab.alpha / len(METRICS)  # the A/B test's split: one alpha over all its metrics
    stats = {
        m: compare(arms["champion"][m], arms["challenger"][m], ab.tau[m], a, ab.var_floor)
        for m in rule.margin
    }
    for m, s in stats.items():
        s.explained = explained[m]
    n = test.arms["challenger"]["sla"].n
    text = f"{rule.describe()}; {ab.describe()}"
    # both verdicts wait for min_workflows on each arm: at a handful of workflows the variance
    # floor, not the data, sets the interval's width
    if min(n, test.arms["champion"]["sla"].n) < rule.min_workflows:
        why = f"canary: {n} of {rule.min_workflows} challenger workflows"
        return CanaryCheck("waiting", n, Verdict("continue", why, text, stats))
    worse = [m for m, s in stats.items() if s.upper < -rule.margin[m]]
    if worse:
        on = ", ".join(worse)
        why = f"canary: the slice is worse than the champion by more than the margin on {on}"
        return CanaryCheck("worse", n, Verdict("retire", why, text, stats))
    why = f"canary clean: {n} challenger workflows, not worse than the margin"
    return CanaryCheck("clean", n, Verdict("continue", why, text, stats))
