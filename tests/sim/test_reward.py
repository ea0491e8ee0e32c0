"""The reward function: signs, weights, and the linear deadline penalty."""

from __future__ import annotations

import pytest

from dagsched.sim.config import RewardWeights
from dagsched.sim.reward import TaskOutcome, decision_reward, reward_terms


def _o(**kw: object) -> TaskOutcome:
    base: dict[str, object] = dict(
        lateness=0.0,
        failed=False,
        reserved_core_s=10.0,
        ideal_core_s=10.0,
        jain_at_decision=1.0,
        migrated=False,
        transfer_s=0.0,
        compute_s=10.0,
    )
    base.update(kw)
    return TaskOutcome(**base)  # type: ignore[arg-type]


def test_weighted_sum_equals_terms() -> None:
    w = RewardWeights()
    for o in (
        _o(),
        _o(lateness=0.7, migrated=True, transfer_s=3.0, jain_at_decision=0.5),
        _o(failed=True, reserved_core_s=100.0),
    ):
        t = reward_terms(o)
        want = sum(getattr(w, k) * v for k, v in t.items())
        assert decision_reward(o, w) == pytest.approx(want)


def test_deadline_penalty_grows_linearly_with_lateness() -> None:
    w = RewardWeights(deadline=1.0, cost=0, fairness=0, stability=0, network=0)
    r1, r2, r3 = (decision_reward(_o(lateness=x), w) for x in (0.5, 1.0, 1.5))
    assert r1 > r2 > r3
    assert r1 - r2 == pytest.approx(r2 - r3)
    assert decision_reward(_o(lateness=0.0), w) == 0.0


def test_each_term_penalises_what_it_names() -> None:
    base = reward_terms(_o())
    assert reward_terms(_o(reserved_core_s=30.0))["cost"] < base["cost"]
    assert reward_terms(_o(jain_at_decision=0.3))["fairness"] < base["fairness"]
    assert reward_terms(_o(migrated=True))["stability"] == -1.0
    assert reward_terms(_o(transfer_s=10.0))["network"] == pytest.approx(-0.5)
    assert reward_terms(_o(failed=True))["deadline"] == -1.0
