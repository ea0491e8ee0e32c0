"""Offline PPO on the simulator, readable like CleanRL's `ppo.py`.

1. Fit the feature normalizer on curriculum episodes played by the model's base
   (heft_history with SRPT priorities): the untrained residual model decides exactly as it.
2. Optionally imitate a heuristic (a few supervised epochs; not needed for the base).
3. The value head alone on the base's rollouts (`critic_warmup_updates`), so the first
   advantages are not noise.
4. PPO: advantages either by GAE on `num_envs` simulators (rollout length min(2048, 3 x mean
   DAG size) rounded down to a multiple of 64 per simulator), or input-driven
   (`advantage: input`: `num_envs` whole episodes of one arrival sequence per update, each
   decision's baseline the other episodes' return from its time on; `learner.input_baseline`);
   `update_epochs` epochs of minibatches, clipped loss, gradient-norm clip, entropy bonus,
   and a KL term and budget to the heft_history base (`kl_coef`, `kl_budget`).
Metrics go to a callback keyed by path (`losses/approx_kl`, `charts/episode_sla`).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dagsched.core.bounds import ACTION_NAMES
from dagsched.core.observation import ANCHOR_FLOOR, Observation, observe
from dagsched.learner.curriculum import Curriculum
from dagsched.learner.input_baseline import input_driven_advantages, returns_to_go
from dagsched.learner.ppo_math import compute_gae, ppo_loss
from dagsched.learner.rollout import RolloutWorker, Transition, play_episode, stack
from dagsched.policy.collate import collate
from dagsched.policy.model import ActorCritic, ModelConfig, evaluate, kl_to_base, to_unit
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler
from dagsched.service_config import TrainSettings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy
from dagsched.sim.snapshot import cluster_view, task_view

MetricsSink = Callable[[dict[str, float], int], None]
# the heuristic the model's residual starts at: it plays the episodes the normalizer is fitted on
BASE_POLICY = "heft_history_srpt"


@dataclass
class TrainResult:
    """A trained model with its normalizer and what it took."""

    model: ActorCritic
    normalizer: FeatureNormalizer
    updates: int
    decisions: int
    wall_s: float
    history: list[dict[str, float]] = field(default_factory=list)


def rollout_length(mean_dag_size: float, cap: int = 2048) -> int:
    """min(cap, 3 x mean DAG size) rounded down to a multiple of 64 (at least 64)."""
    return max(64, int(min(cap, 3 * mean_dag_size)) // 64 * 64)


class RewardScaler:
    """Divides rewards by a running standard deviation of the discounted return (as
    Stable-Baselines3's VecNormalize does), one running return per simulator."""

    def __init__(self, gamma: float, envs: int) -> None:
        self.gamma = gamma
        self.ret = np.zeros(envs)
        self.count = 1e-4
        self.mean = 0.0
        self.var = 1.0

    @property
    def std(self) -> float:
        return float(np.sqrt(self.var + 1e-8))

    def update(self, env: int, rewards: np.ndarray, dones: np.ndarray) -> None:
        """Fold one simulator's rewards (in decision order) into the statistics."""
        rets = np.empty(len(rewards))
        r = self.ret[env]
        for i, (rew, done) in enumerate(zip(rewards, dones, strict=True)):
            r = r * self.gamma + rew
            rets[i] = r
            if done:
                r = 0.0
        self.ret[env] = r
        n = len(rets)
        if n == 0:
            return
        b_mean, b_var = float(rets.mean()), float(rets.var())
        delta, tot = b_mean - self.mean, self.count + n
        self.mean += delta * n / tot
        m2 = self.var * self.count + b_var * n + delta**2 * self.count * n / tot
        self.var, self.count = m2 / tot, tot


def explained_variance(values: np.ndarray, returns: np.ndarray) -> float:
    """1 - Var(returns - values) / Var(returns): how much of the returns the critic saw
    coming at collection time (1 perfect, 0 no better than a constant)."""
    var = float(np.var(returns))
    return float("nan") if var == 0 else 1.0 - float(np.var(returns - values)) / var


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def demonstrations(
    curriculum: Curriculum, episodes: int, teacher: str, seed: int
) -> tuple[list[Observation], list[int], list[list[float]]]:
    """Raw observations and the teacher's actions over `episodes` curriculum episodes."""
    obs: list[Observation] = []
    nodes: list[int] = []
    units: list[list[float]] = []
    for ep in range(episodes):
        scenario, wfs = curriculum(seed * 1000 + ep)
        policy = make_policy(teacher, seed + ep)
        sim = Simulator(scenario, wfs, seed=seed + ep)
        while (batch := sim.advance()) is not None:
            view = cluster_view(sim).batch_copy()  # as the model sees a batch: in order
            decisions = policy.decide(sim, batch)
            for d in decisions:
                tv = task_view(d.task, sim)
                obs.append(observe(view, tv))
                view.take(tv, d.node, d.cpu, d.mem)
                nodes.append(d.node)
                # heft_history_srpt is the model's base: imitating it leaves the shifts at 0
                u = to_unit(torch.tensor([d.cpu, d.mem, float(d.max_retries), d.priority]))
                units.append(u.clamp(ANCHOR_FLOOR, 1 - ANCHOR_FLOOR).tolist())
            sim.apply(decisions, batch)
    return obs, nodes, units


def hold_residuals(model: ActorCritic, trained: tuple[str, ...]) -> None:
    """Keep every residual not in `trained` where it starts, at zero: gradient hooks zero the
    parameters that produce it (the whole node scorer; a value's shift and concentration rows
    of the continuous head's last layer). Those start at zero weights, so the residual stays
    exactly zero however the shared layers below it move. Adam leaves a parameter whose
    gradient is always zero where it is."""
    if "node" not in trained:
        for p in model.scorer.parameters():
            p.register_hook(torch.zeros_like)
    held = [i for i, name in enumerate(ACTION_NAMES) if name not in trained]
    if not held:
        return
    last = model.cont_head[-1]
    assert isinstance(last, torch.nn.Linear)
    keep = torch.ones(last.out_features, 1)
    for i in held:
        keep[2 * i : 2 * i + 2] = 0.0  # the value's shift and concentration rows
    last.weight.register_hook(lambda g: g * keep.to(g.device))
    last.bias.register_hook(lambda g: g * keep[:, 0].to(g.device))


def imitate(
    model: ActorCritic,
    normalizer: FeatureNormalizer,
    obs: list[Observation],
    nodes: list[int],
    units: list[list[float]],
    epochs: int,
    lr: float,
    device: torch.device,
    sink: MetricsSink | None = None,
) -> None:
    """Behaviour cloning of the teacher's actions (maximum likelihood of node and values)."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    normed = [normalizer.transform(o) for o in obs]
    idx = np.arange(len(obs))
    step = 0
    for _ in range(epochs):
        np.random.shuffle(idx)
        for start in range(0, len(idx), 64):
            mb = idx[start : start + 64]
            batch = collate([normed[i] for i in mb]).to(device)
            out = model(*batch.args())
            node = torch.tensor([nodes[i] for i in mb], device=device)
            unit = torch.tensor([units[i] for i in mb], device=device)
            logp, _ = evaluate(out, node, unit)
            loss = -logp.mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            step += 1
            if sink is not None and step % 20 == 0:
                sink({"imitation/nll": float(loss.detach())}, step)


def train(
    scenario: ScenarioConfig,
    hp: TrainSettings,
    *,
    updates: int | None = None,
    minutes: float | None = None,
    seed: int = 0,
    warm_start: str | None = None,
    checkpoint: Path | None = None,
    imitation_episodes: int = 8,
    imitation_epochs: int = 4,
    sink: MetricsSink | None = None,
    on_update: Callable[[int, int | None], None] | None = None,
    device: torch.device | None = None,
) -> TrainResult:
    """Train from scratch (or resume from `checkpoint` if it exists); stop after `updates`
    PPO updates or `minutes` of wall time, whichever comes first."""
    if updates is None and minutes is None:
        raise ValueError("give updates or minutes")
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(seed)
    started = time.perf_counter()
    curriculum = Curriculum(scenario, hp.episode_workflows, load=hp.load_range)
    model = ActorCritic(ModelConfig(hidden=hp.hidden)).to(device)
    hold_residuals(model, hp.residuals)
    critic = [p for n, p in model.named_parameters() if n.split(".")[0] == "critic"]
    rest = [p for n, p in model.named_parameters() if n.split(".")[0] != "critic"]
    # one parameter group unless the critic has its own rate: checkpoints of runs before
    # `critic_lr` existed still resume
    groups: list[dict[str, Any]] = [{"params": list(model.parameters())}]
    if hp.critic_lr is not None:
        groups = [{"params": rest}, {"params": critic, "lr": hp.critic_lr}]
    opt = torch.optim.Adam(groups, lr=hp.learning_rate, eps=1e-5)
    scaler = RewardScaler(hp.gamma, hp.num_envs) if hp.reward_norm else None
    start_update = 0
    warmed = 0
    if checkpoint is not None and checkpoint.exists():
        state = torch.load(checkpoint, map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        normalizer = state["normalizer"]
        start_update = state["update"]
        warmed = state.get("critic_warmup", hp.critic_warmup_updates)
        if scaler is not None and state.get("reward_scaler") is not None:
            scaler = state["reward_scaler"]
    else:
        curriculum.progress = 1.0  # demonstrations and the normalizer see every stage
        demo_obs, demo_nodes, demo_units = demonstrations(
            curriculum,
            episodes=imitation_episodes,
            teacher=warm_start or BASE_POLICY,
            seed=seed,
        )
        normalizer = FeatureNormalizer().fit(demo_obs)
        if warm_start:
            imitate(
                model,
                normalizer,
                demo_obs,
                demo_nodes,
                demo_units,
                epochs=imitation_epochs,
                lr=1e-3,
                device=device,
                sink=sink,
            )
        curriculum.progress = 0.0

    mean_size = float(np.mean(scenario.workload.size))
    steps = hp.rollout_steps or rollout_length(mean_size, hp.max_rollout)
    workers = [RolloutWorker(curriculum, seed=seed * 31 + i) for i in range(hp.num_envs)]
    # Rollouts decide one task at a time: that runs faster on the CPU than on a GPU, and the
    # scheduler feeds CPU tensors. The PPO update runs on `device`; the actor is synced back.
    actor = model if device.type == "cpu" else ActorCritic(model.cfg)
    history: list[dict[str, float]] = []
    decisions = 0
    deadline = started + minutes * 60 if minutes is not None else float("inf")

    rounds = [0]
    episodes: list[dict[str, float]] = []

    def collect_input(sched: GNNScheduler) -> tuple[list[Observation], dict[str, np.ndarray]]:
        """`num_envs` whole episodes of one arrival sequence, input-driven advantages."""
        sequence = seed * 1_000_003 + start_update * 7 + rounds[0]
        rounds[0] += 1
        sc, wfs = curriculum(sequence)
        played: list[list[Transition]] = []
        for _ in range(hp.num_envs):  # the same world; only the sampled actions differ
            trs, summary = play_episode(sc, wfs, sequence, sched)
            played.append(trs)
            episodes.append(summary)
        rewards = [np.array([t.reward for t in trs]) for trs in played]
        advs = input_driven_advantages([np.array([t.at for t in trs]) for trs in played], rewards)
        parts = []
        for trs, adv, rew in zip(played, advs, rewards, strict=True):
            arr = stack(trs)
            arr["raw_reward"] = arr["reward"]
            arr["advantage"], arr["return"] = adv, returns_to_go(rew)
            parts.append(arr)
        b_obs = [normalizer.transform(t.obs) for trs in played for t in trs]
        return b_obs, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    def collect() -> tuple[list[Observation], dict[str, np.ndarray]]:
        if actor is not model:
            actor.load_state_dict(model.state_dict())
        model.eval()
        sched = GNNScheduler(actor, normalizer, "training", deterministic=False)
        if hp.advantage == "input":
            return collect_input(sched)
        b_obs: list[Observation] = []
        parts: list[dict[str, np.ndarray]] = []
        for i, w in enumerate(workers):
            trs, last_value = w.collect(steps, sched)
            arr = stack(trs)
            arr["raw_reward"] = arr["reward"]
            if scaler is not None:
                scaler.update(i, arr["reward"], arr["done"])
                arr["reward"] = arr["reward"] / scaler.std
            adv, ret = compute_gae(
                arr["reward"], arr["value"], arr["done"], last_value, hp.gamma, hp.gae_lambda
            )
            arr["advantage"], arr["return"] = adv, ret
            parts.append(arr)
            b_obs += [normalizer.transform(t.obs) for t in trs]
        return b_obs, {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

    # The value head alone, on rollouts of the frozen warm-started actor: until it is fitted,
    # PPO's advantages are noise that moves the policy away from its start.
    if warmed < hp.critic_warmup_updates:
        curriculum.progress = 0.0 if hp.curriculum else 1.0
        critic_opt = torch.optim.Adam(critic, lr=hp.critic_lr or hp.learning_rate, eps=1e-5)
        while warmed < hp.critic_warmup_updates and time.perf_counter() < deadline:
            b_obs, b = collect()
            decisions += len(b_obs)
            metrics = _value_update(model, critic_opt, hp, b_obs, b, device)
            warmed += 1
            metrics["charts/mean_reward"] = float(b["raw_reward"].mean())
            metrics["losses/explained_variance"] = explained_variance(b["value"], b["return"])
            history.append(metrics)
            if sink is not None:
                sink(metrics, warmed - hp.critic_warmup_updates)

    update = start_update
    total = updates if updates is not None else None
    while (updates is None or update < updates) and time.perf_counter() < deadline:
        if not hp.curriculum:
            curriculum.progress = 1.0
        elif total is not None:
            curriculum.progress = update / max(1, total)
        elif minutes is not None:
            curriculum.progress = (time.perf_counter() - started) / (minutes * 60)
        b_obs, b = collect()
        decisions += len(b_obs)
        metrics = _ppo_update(model, opt, hp, b_obs, b, device)
        update += 1
        metrics["charts/mean_reward"] = float(b["raw_reward"].mean())
        metrics["losses/explained_variance"] = explained_variance(b["value"], b["return"])
        finished = [s for w in workers for s in w.stats.summaries] + episodes
        for w in workers:
            w.stats.summaries.clear()
        episodes.clear()
        if finished:
            metrics["charts/episode_sla"] = float(np.mean([s["sla_attainment"] for s in finished]))
            metrics["charts/episode_jct_s"] = float(np.mean([s["mean_jct_s"] for s in finished]))
        metrics["charts/decisions"] = float(decisions)
        metrics["charts/updates_per_s"] = (update - start_update) / (time.perf_counter() - started)
        history.append(metrics)
        if sink is not None:
            sink(metrics, update)
        if on_update is not None:
            on_update(update, updates)
        if checkpoint is not None and update % 10 == 0:
            _save_checkpoint(checkpoint, model, opt, normalizer, update, warmed, scaler)
    if checkpoint is not None:
        _save_checkpoint(checkpoint, model, opt, normalizer, update, warmed, scaler)
    model.eval()
    return TrainResult(
        model.cpu(), normalizer, update, decisions, time.perf_counter() - started, history
    )


def _ppo_update(
    model: ActorCritic,
    opt: torch.optim.Optimizer,
    hp: TrainSettings,
    b_obs: list[Observation],
    b: dict[str, np.ndarray],
    device: torch.device,
) -> dict[str, float]:
    model.train()
    n = len(b_obs)
    t = {k: torch.as_tensor(v, device=device) for k, v in b.items()}
    inds = np.arange(n)
    last: dict[str, Any] = {}
    epochs = 0
    for _epoch in range(hp.update_epochs):
        if hp.target_kl is not None and last and float(last["losses/approx_kl"]) > hp.target_kl:
            break  # the policy has moved far enough from the one that collected the data
        if hp.kl_budget is not None and last and float(last["losses/kl_to_base"]) > hp.kl_budget:
            break  # as far from heft_history as this update may take it
        epochs += 1
        np.random.shuffle(inds)
        for start in range(0, n, hp.minibatch_size):
            mb = inds[start : start + hp.minibatch_size]
            batch = collate([b_obs[i] for i in mb]).to(device)
            out = model(*batch.args())
            mbt = torch.as_tensor(mb, device=device)
            newlogprob, entropy = evaluate(out, t["node"][mbt], t["unit"][mbt])
            parts = ppo_loss(
                newlogprob,
                t["logprob"][mbt],
                t["advantage"][mbt].float(),
                out.value,
                t["return"][mbt].float(),
                entropy,
                hp.clip_coef,
                hp.ent_coef,
                hp.vf_coef,
            )
            kl_base = kl_to_base(
                out, batch.base_logits, batch.mask, batch.anchor, t["node"][mbt]
            ).mean()
            opt.zero_grad()
            actor_loss = parts.pg_loss - hp.ent_coef * parts.entropy + hp.kl_coef * kl_base
            if hp.value_trunk_grad:
                (actor_loss + hp.vf_coef * parts.v_loss).backward()
            else:  # the value loss reaches the value head only
                critic = list(model.critic.parameters())
                grads = torch.autograd.grad(hp.vf_coef * parts.v_loss, critic, retain_graph=True)
                actor_loss.backward()
                for p, g in zip(critic, grads, strict=True):
                    p.grad = g if p.grad is None else p.grad + g
            torch.nn.utils.clip_grad_norm_(model.parameters(), hp.max_grad_norm)
            opt.step()
            last = {
                "losses/policy_loss": parts.pg_loss,
                "losses/value_loss": parts.v_loss,
                "losses/entropy": parts.entropy,
                "losses/approx_kl": parts.approx_kl,
                "losses/clipfrac": parts.clipfrac,
                "losses/kl_to_base": kl_base.detach(),
            }
    return {**{k: float(v.detach()) for k, v in last.items()}, "losses/epochs": float(epochs)}


def _value_update(
    model: ActorCritic,
    opt: torch.optim.Optimizer,
    hp: TrainSettings,
    b_obs: list[Observation],
    b: dict[str, np.ndarray],
    device: torch.device,
) -> dict[str, float]:
    """`update_epochs` epochs of the value loss alone; `opt` holds the value head's
    parameters only, so the actor is untouched."""
    model.train()
    returns = torch.as_tensor(b["return"], device=device).float()
    inds = np.arange(len(b_obs))
    losses: list[float] = []
    for _epoch in range(hp.update_epochs):
        np.random.shuffle(inds)
        for start in range(0, len(inds), hp.minibatch_size):
            mb = inds[start : start + hp.minibatch_size]
            batch = collate([b_obs[i] for i in mb]).to(device)
            with torch.no_grad():  # the encoder is the actor's: only the head learns
                dag = model.encode_dag(
                    batch.dag_x, batch.dag_edges, batch.dag_batch, batch.this_task, len(mb)
                )
            out = model.heads(
                batch.nodes, batch.mask, batch.cluster, dag, batch.anchor, batch.base_logits
            )
            v_loss = 0.5 * ((out.value - returns[torch.as_tensor(mb, device=device)]) ** 2).mean()
            opt.zero_grad()
            v_loss.backward()
            torch.nn.utils.clip_grad_norm_(model.critic.parameters(), hp.max_grad_norm)
            opt.step()
            losses.append(float(v_loss.detach()))
    return {"losses/warmup_value_loss": float(np.mean(losses[-max(1, len(losses) // 4) :]))}


def _save_checkpoint(
    path: Path,
    model: ActorCritic,
    opt: torch.optim.Optimizer,
    normalizer: FeatureNormalizer,
    update: int,
    critic_warmup: int = 0,
    scaler: RewardScaler | None = None,
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "normalizer": normalizer,
            "update": update,
            "critic_warmup": critic_warmup,
            "reward_scaler": scaler,
        },
        tmp,
    )
    tmp.replace(path)
