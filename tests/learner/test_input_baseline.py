"""Input-driven baselines: exact small cases, and the variance they remove."""

from __future__ import annotations

import numpy as np
import pytest

from dagsched.learner.input_baseline import input_driven_advantages, return_at, returns_to_go


def test_returns_to_go_sum_the_rest_of_the_episode() -> None:
    np.testing.assert_array_equal(returns_to_go(np.array([1.0, 2.0, 3.0])), [6.0, 5.0, 3.0])


def test_a_rollouts_return_is_read_at_an_instant_by_time() -> None:
    times, rtg = np.array([0.0, 10.0, 20.0]), np.array([6.0, 5.0, 3.0])
    # at or after the instant: the first decision not before it; past the last: nothing left
    np.testing.assert_array_equal(return_at(times, rtg, np.array([0.0, 5.0, 10.0, 25.0])),
                                  [6.0, 5.0, 5.0, 0.0])  # fmt: skip


def test_each_decisions_baseline_is_the_other_rollouts_return_from_its_time() -> None:
    times = [np.array([0.0, 10.0]), np.array([0.0, 5.0, 20.0]), np.array([0.0, 30.0])]
    rewards = [np.array([-1.0, -2.0]), np.array([-1.0, -1.0, -1.0]), np.array([-4.0, -1.0])]
    a, b, c = input_driven_advantages(times, rewards)
    # rollout 0: returns-to-go [-3, -2]; at t=0 the others have -3 and -5, at t=10 -1 and -1
    np.testing.assert_allclose(a, [-3.0 - (-4.0), -2.0 - (-1.0)])
    # rollout 1: [-3, -2, -1]; at t=5: rollout 0 -2, rollout 2 -1; at t=20: 0 and -1
    np.testing.assert_allclose(b, [-3.0 - (-4.0), -2.0 - (-1.5), -1.0 - (-0.5)])
    # rollout 2: [-5, -1]; at t=30 both others are done
    np.testing.assert_allclose(c, [-5.0 - (-3.0), -1.0 - 0.0])


def test_rollouts_that_act_alike_have_no_advantage() -> None:
    t, r = np.array([0.0, 3.0, 9.0]), np.array([-2.0, -5.0, -1.0])
    for adv in input_driven_advantages([t, t, t], [r, r, r]):
        np.testing.assert_array_equal(adv, np.zeros(3))


def test_the_input_variance_is_removed_and_the_actions_signal_kept() -> None:
    """Rewards = what the arrival sequence does (large, shared by the rollouts of a sequence)
    + what each rollout's actions do (small). The advantage is exactly the actions' part of
    the return against the others', and the sequence's share of the variance is gone."""
    rng = np.random.default_rng(0)
    raw, adv, actions_part = [], [], []
    steps, times = 50, np.arange(50, dtype=float)
    for _ in range(200):
        sequence = rng.normal(0.0, 10.0, steps)  # the input's reward at each instant
        effects = rng.normal(0.0, 0.5, 4)  # what each rollout's actions add per step
        rewards = [sequence + e for e in effects]
        for i, a in enumerate(input_driven_advantages([times] * 4, rewards)):
            raw.append(returns_to_go(rewards[i])[0])
            adv.append(a[0])
            actions_part.append(steps * (effects[i] - np.delete(effects, i).mean()))
    np.testing.assert_allclose(adv, actions_part, atol=1e-9)
    assert np.var(adv) < np.var(raw) / 5


def test_one_rollout_has_no_input_driven_baseline() -> None:
    with pytest.raises(ValueError, match="at least two"):
        input_driven_advantages([np.zeros(2)], [np.zeros(2)])
