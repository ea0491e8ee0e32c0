"""The canary: with a canary rule the live A/B promotes nothing; it retires a slice worse
than its margin and says when a replay win may promote."""

from __future__ import annotations

import numpy as np

from dagsched.learner.canary import CanaryRule, check
from dagsched.learner.live_ab import Judge, Sample
from dagsched.learner.sequential import ABTest, DecisionRule

RULE = DecisionRule(min_samples=50, max_samples=2000, adjust=False)
CANARY = CanaryRule(min_workflows=30, margin={"sla": 0.05, "speed": 0.05})


def _sample(rng: np.random.Generator, version: str, sla: float, speed: float) -> Sample:
    met = float(rng.random() < sla)
    return Sample("wf", "x", version, met, -0.5, float(rng.normal(speed, 0.3)))


def _run(judge: Judge, rng: np.random.Generator, sla: float, speed: float, n: int) -> list:
    actions = []
    for i in range(n):
        s = _sample(rng, "v2", sla, speed) if i % 2 else _sample(rng, "v1", 0.9, 0.5)
        actions.append(judge.add(s))
    return actions


def test_a_much_better_slice_is_never_promoted_by_the_canary() -> None:
    judge = Judge(RULE, guardrail_window=100, canary=CANARY)
    judge.versions("v1", "v2")
    actions = _run(judge, np.random.default_rng(0), 1.0, 1.5, 3000)
    assert all(a is None or a[0] != "promote" for a in actions)
    assert judge.canary is not None and judge.canary.status == "clean"


def test_a_slice_worse_than_the_margin_is_retired() -> None:
    judge = Judge(RULE, guardrail_window=100, canary=CANARY)
    judge.versions("v1", "v2")
    actions = _run(judge, np.random.default_rng(1), 0.5, -0.5, 2000)
    first = next(a for a in actions if a is not None)
    assert first[0] == "retire" and "canary" in first[1].reason
    assert first[1].stats["sla"].upper < -0.05 or first[1].stats["speed"].upper < -0.05


def test_a_slice_a_little_worse_than_the_champion_is_within_the_margin() -> None:
    # 2 SLA points and 2% speed worse: inside margins of 5, so the canary stays clean
    judge = Judge(RULE, guardrail_window=100, canary=CANARY)
    judge.versions("v1", "v2")
    actions = _run(judge, np.random.default_rng(2), 0.88, 0.48, 3000)
    assert all(a is None for a in actions)
    assert judge.canary is not None and judge.canary.status == "clean"


def test_the_canary_waits_for_its_workflows_and_restarts_with_a_new_pair() -> None:
    test = ABTest(RULE)
    rng = np.random.default_rng(3)
    for _ in range(29):
        test.add("champion", 1.0, -0.5, float(rng.normal(0.5, 0.3)))
        test.add("champion", 1.0, -0.5, float(rng.normal(0.5, 0.3)))
        test.add("challenger", 1.0, -0.5, float(rng.normal(0.5, 0.3)))
    assert check(test, CANARY).status == "waiting"
    test.add("challenger", 1.0, -0.5, 0.5)
    c = check(test, CANARY)
    assert c.status == "clean" and c.workflows == 30
    judge = Judge(RULE, guardrail_window=100, canary=CANARY)
    judge.versions("v1", "v2")
    _run(judge, rng, 0.9, 0.5, 100)
    assert judge.canary is not None
    judge.versions("v1", "v3")
    assert judge.canary is None


def test_a_canary_with_no_replay_verdict_is_retired_at_the_budget() -> None:
    judge = Judge(DecisionRule(min_samples=10, max_samples=40, adjust=False), 100, CANARY)
    judge.versions("v1", "v2")
    actions = _run(judge, np.random.default_rng(4), 0.9, 0.5, 200)
    first = next(a for a in actions if a is not None)
    assert first[0] == "retire" and "budget" in first[1].reason
    assert actions.index(first) == 79  # the challenger's 40th workflow
