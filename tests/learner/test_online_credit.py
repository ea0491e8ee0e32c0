"""Advantages of an online round: per-task credit, and the critic's baseline through the
least-squares line that best predicts the window's returns."""

from __future__ import annotations

import pytest
import torch

from dagsched.learner.joining import Joined
from dagsched.learner.online import advantages


def _j(task: str, attempt: int, reward: float) -> Joined:
    return Joined(
        key=(task, attempt), workflow_id=task.split("/")[0], arm="explore", version="v1",
        reward=reward, failed=False, on_time=True, end_at=0.0, max_retries=3,
    )  # fmt: skip


def test_task_critic_removes_what_the_value_predicts() -> None:
    """Returns that are a line in the critic's value plus a small action effect: without the
    baseline the busy-cluster term drowns the effect, with it the effect decides the sign."""
    gen = torch.Generator().manual_seed(0)
    n = 400
    values = torch.randn(n, generator=gen)
    effect = torch.where(torch.arange(n) % 2 == 0, 0.1, -0.1)  # the action's own worth
    returns = -3.0 + 2.0 * values + effect
    data = [_j(f"wf{i}/0", 0, float(r)) for i, r in enumerate(returns)]
    rewards = torch.tensor([j.reward for j in data])
    plain = advantages(data, rewards, values, "task")
    based = advantages(data, rewards, values, "task-critic")
    good = effect > 0
    assert (based[good] > 0).all() and (based[~good] < 0).all()
    assert ((plain > 0) != good).float().mean() > 0.3  # the value term flips many signs
    assert based.mean().abs() < 1e-5 and based.std() == pytest.approx(1.0, abs=1e-3)


def test_task_credit_charges_an_oom_kill_its_retry() -> None:
    data = [_j("wf/0", 0, -1.0), _j("wf/0", 1, -0.5), _j("wf/1", 0, -0.2)]
    adv = advantages(data, torch.tensor([-1.0, -0.5, -0.2]), torch.zeros(3), "task")
    assert adv[0] < adv[1] < adv[2]  # the killed attempt pays for its retry too
    with pytest.raises(ValueError, match="unknown credit"):
        advantages(data, torch.zeros(3), torch.zeros(3), "oracle")
