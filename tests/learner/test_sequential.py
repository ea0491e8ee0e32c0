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


def _covariate_run(seed: int, effect: float, adjust: bool, k: int = 6) -> tuple[str, int]:
    """Workflows whose speed is mostly set by known covariates (slack, congestion: 80% of the
    variance), the challenger `effect` faster; half to each arm until the test decides."""
    rng = np.random.default_rng(seed)
    test = ABTest(DecisionRule(min_samples=50, max_samples=20_000, adjust=adjust))
    beta = rng.normal(size=k)
    beta *= 0.8 / np.linalg.norm(beta)
    for i in range(1, 100_000):
        arm = "challenger" if rng.random() < 0.5 else "champion"
        x = rng.normal(size=k)
        speed = float(
            x @ beta + rng.normal(0, 0.2 * 2**0.5) + (effect if arm == "challenger" else 0)
        )
        test.add(arm, 1.0, -0.5, speed, tuple(float(v) for v in x))
        if i % 10 == 0 and (v := test.verdict()).decision != "continue":
            return v.decision, i
    raise AssertionError("never decided")


def test_adjusting_on_covariates_decides_with_fewer_workflows() -> None:
    """The same 0.1 speed gain: the adjusted test promotes in well under half the workflows
    the raw test needs, since the covariates explain 80% of the variance."""
    raw = [_covariate_run(s, 0.1, adjust=False) for s in range(5)]
    adj = [_covariate_run(s, 0.1, adjust=True) for s in range(5)]
    assert all(d == "promote" for d, _ in raw + adj)
    assert np.median([n for _, n in adj]) < 0.5 * np.median([n for _, n in raw])


def test_adjusted_a_a_rarely_promotes() -> None:
    """An identical challenger, with covariates that explain most of the variance: the
    adjusted test promotes in at most alpha of the runs (here 0 or 1 of 40)."""
    decisions = [_covariate_run(1000 + s, 0.0, adjust=True)[0] for s in range(40)]
    assert decisions.count("promote") <= 2


def test_the_verdict_says_how_much_variance_the_covariates_removed() -> None:
    rng = np.random.default_rng(5)
    test = ABTest(DecisionRule(min_samples=50))
    for i in range(200):
        x = rng.normal(size=6)
        test.add(
            "challenger" if i % 2 else "champion",
            1.0,
            -0.5,
            float(x[0] + 0.1 * rng.normal()),
            tuple(x),
        )
    v = test.verdict()
    assert v.stats["speed"].explained > 0.9
    assert v.stats["sla"].explained == 0.0  # constant: nothing to explain
    assert "adjusted on log_slack" in v.rule
    raw = test.arms
    assert raw["champion"]["speed"].n == v.stats["speed"].n_champion


def test_workflows_without_covariates_are_left_as_they_are() -> None:
    """Until each arm has 30 workflows with covariates the test runs on the raw outcomes."""
    test = ABTest(DecisionRule(min_samples=2))
    for i in range(100):
        test.add("challenger" if i % 2 else "champion", 1.0, -0.5, float(i % 7), None)
    arms, explained = test.adjusted_arms()
    assert explained == {"sla": 0.0, "reward": 0.0, "speed": 0.0}
    assert arms["champion"]["speed"].mean == test.arms["champion"]["speed"].mean
