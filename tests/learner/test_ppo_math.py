"""GAE and the PPO loss on small cases worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagsched.learner.ppo_math import compute_gae, ppo_loss
from dagsched.learner.train import rollout_length


def test_gae_single_step_is_td_error() -> None:
    adv, ret = compute_gae(np.array([1.0]), np.array([0.5]), np.array([0.0]), 2.0, 0.9, 0.95)
    assert adv[0] == pytest.approx(1.0 + 0.9 * 2.0 - 0.5)
    assert ret[0] == pytest.approx(adv[0] + 0.5)


def test_gae_two_steps_by_hand() -> None:
    r, v = np.array([1.0, 2.0]), np.array([0.0, 1.0])
    g, lam = 0.5, 0.8
    adv, _ = compute_gae(r, v, np.array([0.0, 0.0]), 4.0, g, lam)
    d1 = 2.0 + g * 4.0 - 1.0
    d0 = 1.0 + g * 1.0 - 0.0
    assert adv[1] == pytest.approx(d1)
    assert adv[0] == pytest.approx(d0 + g * lam * d1)


def test_gae_does_not_bootstrap_across_episode_end() -> None:
    adv, _ = compute_gae(
        np.array([1.0, 5.0]), np.array([0.0, 0.0]), np.array([1.0, 0.0]), 100.0, 0.99, 0.95
    )
    assert adv[0] == pytest.approx(1.0)  # nothing flows back from the next episode
    assert adv[1] == pytest.approx(5.0 + 0.99 * 100.0)


def test_ppo_loss_clips_the_ratio() -> None:
    old = torch.zeros(2)
    new = torch.log(torch.tensor([2.0, 2.0]))  # ratio 2, far outside 1 +- 0.2
    adv = torch.tensor([1.0, 1.0])
    parts = ppo_loss(
        new, old, adv, None, None, torch.zeros(2), 0.2, 0.0, 0.5, normalize_advantages=False
    )
    assert float(parts.pg_loss) == pytest.approx(-1.2)  # clipped at 1.2 for positive advantage
    assert float(parts.clipfrac) == 1.0
    assert float(parts.v_loss) == 0.0
    neg = ppo_loss(
        new, old, -adv, None, None, torch.zeros(2), 0.2, 0.0, 0.5, normalize_advantages=False
    )
    assert float(neg.pg_loss) == pytest.approx(2.0)  # pessimistic: unclipped for negative


def test_rollout_length_rule() -> None:
    assert rollout_length(24) == 64  # 72 -> 64
    assert rollout_length(100) == 256  # 300 -> 256
    assert rollout_length(5000) == 2048
    assert rollout_length(1) == 64
