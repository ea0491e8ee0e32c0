"""The always-valid A/B test: A/A never (rarely) promotes, a clearly better arm is promoted."""

from __future__ import annotations

import numpy as np

from dagsched.learner.sequential import ABTest, DecisionRule, Running, compare

RULE = DecisionRule(alpha=0.05, min_samples=50, max_samples=400)


def _run(seed: int, sla_c: float, rule: DecisionRule = RULE, every: int = 10) -> tuple[str, int]:
    """Feed simulated workflows (half to each arm) until the test decides."""
    rng = np.random.default_rng(seed)
    test = ABTest(rule)
    for i in range(1, 100_000):
        arm = "challenger" if rng.random() < 0.5 else "champion"
        p = sla_c if arm == "challenger" else 0.8
        test.add(arm, float(rng.random() < p), float(rng.normal(-0.5, 0.2)), float(rng.normal()))
        if i % every == 0:
            v = test.verdict()
            if v.decision != "continue":
                return v.decision, i
    raise AssertionError("never decided")


def test_running_matches_numpy() -> None:
    x = np.random.default_rng(0).normal(size=100)
    r = Running()
    for v in x:
        r.add(float(v))
    assert r.n == 100
    assert np.isclose(r.mean, x.mean()) and np.isclose(r.var, x.var(ddof=1))


def test_interval_contains_the_estimate_and_narrows() -> None:
    a, b = Running(), Running()
    widths = []
    rng = np.random.default_rng(1)
    for n in range(1, 2001):
        a.add(float(rng.normal()))
        b.add(float(rng.normal()))
        if n in (100, 2000):
            s = compare(a, b, tau=0.1, alpha=0.025, var_floor=1e-4)
            assert s.lower < s.diff < s.upper
            widths.append(s.upper - s.lower)
    assert widths[1] < widths[0] / 3


def test_aa_false_promotions_at_most_alpha() -> None:
    runs = [_run(seed, sla_c=0.8) for seed in range(120)]
    promoted = sum(d == "promote" for d, _ in runs)
    assert promoted / len(runs) <= 0.05
    assert all(d in ("promote", "retire") for d, _ in runs)  # the budget always ends it


def test_clearly_better_challenger_is_promoted() -> None:
    runs = [_run(seed, sla_c=0.95) for seed in range(20)]
    assert sum(d == "promote" for d, _ in runs) >= 19


def test_clearly_worse_challenger_is_retired() -> None:
    runs = [_run(seed, sla_c=0.6) for seed in range(10)]
    assert all(d == "retire" for d, _ in runs)


def test_no_decision_before_min_samples_and_verdict_prints_the_rule() -> None:
    test = ABTest(DecisionRule(min_samples=100))
    for _ in range(60):
        test.add("champion", 0.0, -1.0, 0.0)
        test.add("challenger", 1.0, 0.0, 0.0)
    v = test.verdict()
    assert v.decision == "continue" and "min_samples=100" in v.rule
    for _ in range(60):
        test.add("champion", 0.0, -1.0, 0.0)
        test.add("challenger", 1.0, 0.0, 0.0)
    v = test.verdict()
    assert v.decision == "promote"
    d = v.to_dict()
    assert d["stats"]["sla"]["n_challenger"] == 120 and "alpha=0.05" in d["rule"]


def test_a_faster_challenger_with_the_same_sla_is_promoted_on_speed() -> None:
    """Workflows done 15% sooner (log-normal JCT / deadline, sd 0.5) with the same SLA and
    reward: only the speed metric can tell, and it does, within a few hundred workflows."""
    rng = np.random.default_rng(3)
    test = ABTest(DecisionRule(min_samples=50))
    verdict = None
    for i in range(1, 4001):
        arm = "challenger" if i % 2 else "champion"
        speed = float(rng.normal(0.5 + (0.15 if arm == "challenger" else 0.0), 0.5))
        test.add(arm, float(rng.random() < 0.9), float(rng.normal(-0.5, 0.2)), speed)
        if i % 20 == 0 and (verdict := test.verdict()).decision != "continue":
            break
    assert verdict is not None and verdict.decision == "promote"
    assert verdict.reason == "challenger better on speed" and i < 1500
