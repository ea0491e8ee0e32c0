"""Online fine-tuning of the heads on the joined serving logs (`learner.joining`).

`finetune_heads` is PPO on the actor heads only (`ActorCritic.actor_parameters`): every other
parameter has `requires_grad=False` and is bitwise unchanged. Importance ratios are against the
logged behaviour log-prob, PPO-clipped; gradient norm clipped; an epoch loop that stops early
once the approximate KL to the champion passes `target_kl`. Credit is per task
(`task_returns`): an attempt is credited with what it and its task's later attempts earned,
so an OOM kill pays for its retry; one-step credit found nothing to learn in the shifted
world (docs/concepts/world.md).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dagsched.learner.joining import Joined
from dagsched.learner.ppo_math import ppo_loss
from dagsched.policy.collate import collate
from dagsched.policy.model import ACTOR_HEADS, ActorCritic, evaluate
from dagsched.policy.normalizer import FeatureNormalizer

# -- fine-tuning --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FinetuneConfig:
    """PPO hyper-parameters of one online round (actor heads only)."""

    learning_rate: float = 1e-4
    clip_coef: float = 0.2
    ent_coef: float = 0.0
    max_grad_norm: float = 0.5
    target_kl: float = 0.02
    update_epochs: int = 4
    minibatch_size: int = 64
    # "task": an attempt's advantage is its reward plus the rewards of its task's later
    # attempts (an OOM kill is charged what its retry then costs), normalised over the window;
    # "task-critic": the same minus a baseline, the champion critic's value mapped onto the
    # window's returns by least squares (a busy cluster's lateness is not the action's);
    # "attempt": its own reward minus the window's mean (one step)
    credit: str = "task"


@dataclass
class FinetuneResult:
    """The shadow model and what the round did (logged as `losses/...`)."""

    model: ActorCritic
    metrics: dict[str, float]


def learning_window(window: Sequence[Joined], explore: bool) -> list[Joined]:
    """What a round fine-tunes on: with an exploration slice on, its sampled attempts only
    (served greedily, an attempt's logged action is the Beta mean, which PPO cannot compare
    with anything), else the whole window; the whole window while the slice has none yet."""
    if explore:
        explored = [j for j in window if j.arm == "explore"]
        if explored:
            return explored
    return list(window)


def task_returns(data: Sequence[Joined]) -> list[float]:
    """Per attempt, its reward plus the rewards of the later attempts of the same task in
    `data`: what deciding this attempt led to. A reservation that gets a task OOM-killed is
    charged its retry's lateness too, which its own reward cannot show."""
    by_task: dict[str, list[int]] = {}
    for i, t in enumerate(data):
        by_task.setdefault(t.key[0], []).append(i)
    out = [0.0] * len(data)
    for idxs in by_task.values():
        acc = 0.0
        for i in sorted(idxs, key=lambda i: data[i].key[1], reverse=True):
            acc += data[i].reward
            out[i] = acc
    return out


def advantages(
    data: Sequence[Joined], rewards: torch.Tensor, values: torch.Tensor, credit: str
) -> torch.Tensor:
    """Per attempt, its advantage under `credit` (`FinetuneConfig.credit`). The critic was
    trained on discounted returns, another scale than one task's rewards: "task-critic" uses
    its value only through the least-squares line that best predicts the window's returns."""
    if credit == "attempt":
        return rewards - rewards.mean()
    if credit not in ("task", "task-critic"):
        raise ValueError(f"unknown credit {credit!r}: task, task-critic or attempt")
    togo = torch.tensor(task_returns(data), dtype=torch.float64)
    if len(data) < 2:
        return (togo * 0).float()
    if credit == "task-critic":
        v = values.to(torch.float64)
        design = torch.stack([torch.ones_like(v), v], dim=1)
        coef = torch.linalg.lstsq(design, togo[:, None]).solution
        togo = togo - (design @ coef).squeeze(1)
    return ((togo - togo.mean()) / (togo.std() + 1e-8)).float()


def freeze_all_but_heads(model: ActorCritic) -> list[torch.nn.Parameter]:
    """Set `requires_grad` on the actor heads only; return those parameters."""
    for name, p in model.named_parameters():
        p.requires_grad_(name.split(".")[0] in ACTOR_HEADS)
    return model.actor_parameters()


def finetune_heads(
    champion: ActorCritic,
    normalizer: FeatureNormalizer,
    transitions: Sequence[Joined],
    cfg: FinetuneConfig | None = None,
    seed: int = 0,
    start: ActorCritic | None = None,
) -> FinetuneResult:
    """A shadow copy of `start` (default: `champion`) whose actor heads took PPO steps on
    `transitions`. The KL limit is always to `champion`, so rounds that resume from the last
    challenger cannot drift further from the champion than one round could."""
    cfg = cfg or FinetuneConfig()
    data = [t for t in transitions if t.trainable]
    if not data:
        raise ValueError("no trainable transitions (none carries an observation)")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = copy.deepcopy(start if start is not None else champion).eval()
    params = freeze_all_but_heads(model)
    opt = torch.optim.Adam(params, lr=cfg.learning_rate, eps=1e-5)

    obs = [normalizer.transform(t.observation) for t in data if t.observation is not None]
    b_node = torch.tensor([t.node_index for t in data], dtype=torch.int64)
    b_unit = torch.tensor([t.unit for t in data], dtype=torch.float32).clamp(1e-4, 1 - 1e-4)
    rewards = torch.tensor([t.reward for t in data], dtype=torch.float32)
    logps, values = [], []
    with torch.no_grad():
        for i in range(0, len(obs), 256):
            out = champion(*collate(obs[i : i + 256]).args())
            logps.append(evaluate(out, b_node[i : i + 256], b_unit[i : i + 256])[0])
            values.append(out.value)
    champ_logp = torch.cat(logps)
    b_adv = advantages(data, rewards, torch.cat(values), cfg.credit)
    logged = torch.tensor([t.log_prob for t in data], dtype=torch.float32)
    # the wire clips log-probs at 0 (a Beta density can exceed 1): use the champion's own
    # log-prob where the logged one was clipped
    b_logp = torch.where(logged < 0, logged, champ_logp)

    n = len(data)
    mb = min(cfg.minibatch_size, n)
    history: list[dict[str, float]] = []
    kl_to_champion = 0.0
    stopped = False
    steps = 0
    for _epoch in range(cfg.update_epochs):
        order = list(range(n))
        rng.shuffle(order)
        for lo in range(0, n, mb):
            idx = order[lo : lo + mb]
            batch = collate([obs[i] for i in idx])
            out = model(*batch.args())
            newlogp, entropy = evaluate(out, b_node[idx], b_unit[idx])
            parts = ppo_loss(
                newlogp,
                b_logp[idx],
                b_adv[idx],
                None,
                None,
                entropy,
                cfg.clip_coef,
                cfg.ent_coef,
                0.0,
            )
            opt.zero_grad()
            parts.loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
            steps += 1
            with torch.no_grad():
                lr = newlogp.detach() - champ_logp[idx]
                kl_to_champion = float(((lr.exp() - 1) - lr).mean())
            history.append(
                {
                    "losses/policy_loss": float(parts.pg_loss.detach()),
                    "losses/entropy": float(parts.entropy.detach()),
                    "losses/approx_kl": float(parts.approx_kl),
                    "losses/clipfrac": float(parts.clipfrac),
                    "losses/grad_norm": float(grad_norm),
                    "losses/kl_to_champion": kl_to_champion,
                }
            )
            if kl_to_champion > cfg.target_kl:
                stopped = True
                break
        if stopped:
            break
    for p in model.parameters():
        p.requires_grad_(True)
    last = history[-1] if history else {}
    metrics = {k: v for k, v in last.items() if math.isfinite(v)}
    metrics.update(
        {
            "online/transitions": float(n),
            "online/steps": float(steps),
            "online/kl_stopped": float(stopped),
            "online/mean_reward": float(rewards.mean()),
        }
    )
    return FinetuneResult(model.eval(), metrics)
