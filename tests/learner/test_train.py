"""Training runs end to end, reproducibly, resumes from its checkpoint, and the CLI registers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dagsched.learner.pipeline import training_scenario
from dagsched.learner.train import train
from dagsched.service_config import TrainSettings
from dagsched.settings import SettingsError, load_settings
from dagsched.sim.config import ScenarioConfig, WorkloadConfig
from tests.unit.test_cli import cli

__all__ = ["cli"]  # the fixture: the CLI in this process

TINY = TrainSettings(num_envs=1, update_epochs=1, rollout_steps=64, minibatch_size=64)


def _scenario() -> ScenarioConfig:
    return replace(ScenarioConfig(), workload=WorkloadConfig(workflows=6, size=(4, 10)))


def _run(**kw: object):
    return train(
        _scenario(),
        TINY,
        seed=3,
        warm_start=None,
        imitation_episodes=1,
        device=torch.device("cpu"),
        **kw,
    )  # type: ignore[arg-type]


def test_same_seed_same_weights() -> None:
    a, b = _run(updates=1), _run(updates=1)
    for (name, pa), (_, pb) in zip(
        a.model.state_dict().items(), b.model.state_dict().items(), strict=True
    ):
        assert torch.equal(pa, pb), name
    assert a.updates == 1 and a.decisions == 64


def test_resume_continues_from_the_checkpoint(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    first = _run(updates=1, checkpoint=ckpt)
    assert ckpt.exists() and first.updates == 1
    second = _run(updates=2, checkpoint=ckpt)
    assert second.updates == 2
    assert second.decisions == 64  # only the one missing update ran


def test_metrics_are_keyed_by_path() -> None:
    seen: dict[str, float] = {}
    _run(updates=1, sink=lambda m, step: seen.update(m))
    for key in (
        "losses/approx_kl",
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "charts/mean_reward",
        "charts/updates_per_s",
    ):
        assert key in seen


def test_cli_train_registers_the_first_version_as_champion(
    tmp_path: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        **os.environ,
        "DAGSCHED_HOME": str(tmp_path / "home"),
        "DAGSCHED_TRAIN__NUM_ENVS": "1",
        "DAGSCHED_TRAIN__UPDATE_EPOCHS": "1",
        "DAGSCHED_TRAIN__ROLLOUT_STEPS": "64",
        "DAGSCHED_SIM__WORKLOAD__SIZE": "[4, 10]",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    cmd = [sys.executable, "-m", "dagsched.cli.main"]
    done = subprocess.run(
        [
            *cmd,
            "train",
            "--updates",
            "1",
            "--warm-start",
            "none",
            "--eval-workflows",
            "2",
            "--export",
            str(tmp_path / "bundle"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "bundle" / "checksums.json").is_file()
    chart = tmp_path / "bundle" / "training.png"  # the curves of the run, for its reader
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the listing in this process (an interpreter that imports torch and MLflow costs ~15 s)
    monkeypatch.setenv("DAGSCHED_HOME", env["DAGSCHED_HOME"])
    listed = cli("models", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    rows = json.loads(listed.stdout)
    assert [r["version"] for r in rows] == ["1"]
    assert rows[0]["aliases"] == ["champion"]
    assert "eval/model_sla" in rows[0]["metrics"]
    assert (tmp_path / "home" / "tensorboard").is_dir()


def test_training_scenario_takes_the_deadline_slack_only_when_set() -> None:
    plain = load_settings(environ={})
    assert training_scenario(plain) == plain.sim
    tight = load_settings(environ={"DAGSCHED_TRAIN__DEADLINE_SLACK": "[1.0, 1.5]"})
    assert training_scenario(tight).workload.slack == (1.0, 1.5)
    assert tight.sim.workload.slack == ScenarioConfig().workload.slack  # evaluation keeps it
    with pytest.raises(SettingsError, match="deadline_slack"):
        load_settings(overrides={"train.deadline_slack": [1.5, 1.0]}, environ={})


def test_input_driven_ppo_moves_from_the_base_within_its_kl_budget() -> None:
    """From the base (an untrained residual decides as heft_history_srpt), input-driven PPO
    moves the actor's residual, and an update stops its epochs once the KL to the base is
    past the budget: a tight budget runs fewer epochs than a loose one."""
    sc = replace(_scenario(), cluster=ScenarioConfig().cluster.scaled(8))

    def one_update(budget: float) -> tuple[dict[str, float], torch.Tensor]:
        hp = TINY.model_copy(
            update={"advantage": "input", "num_envs": 2, "update_epochs": 4,
                    "kl_budget": budget, "learning_rate": 3e-3, "minibatch_size": 32}
        )  # fmt: skip
        seen: dict[str, float] = {}
        result = train(sc, hp, seed=5, updates=1, imitation_episodes=1,
                       sink=lambda m, _s: seen.update(m), device=torch.device("cpu"))  # fmt: skip
        return seen, result.model.scorer[-1].weight.detach()

    loose, moved = one_update(1e9)
    assert moved.abs().sum() > 0  # the residual left zero
    assert loose["losses/epochs"] == 4 and loose["losses/kl_to_base"] > 0
    assert loose["charts/episode_jct_s"] > 0  # whole episodes were played
    tight, _ = one_update(1e-9)
    assert tight["losses/epochs"] == 1


def test_only_the_named_residuals_leave_the_base() -> None:
    """Training the priority residual alone moves its shift rows, and leaves the node scorer
    and the other values' rows exactly where they started (zero: served as the base)."""
    sc = replace(_scenario(), cluster=ScenarioConfig().cluster.scaled(8))
    hp = TINY.model_copy(
        update={"advantage": "input", "num_envs": 2, "update_epochs": 2,
                "learning_rate": 3e-3, "minibatch_size": 32, "residuals": ("priority",)}
    )  # fmt: skip
    model = train(sc, hp, seed=5, updates=1, imitation_episodes=1,
                  device=torch.device("cpu")).model  # fmt: skip
    last = model.cont_head[-1]
    priority = 2 * 3  # (cpu, mem, max_retries, priority): shift row, then concentration row
    assert last.weight[priority].abs().sum() > 0
    held = [r for r in range(last.out_features) if r not in (priority, priority + 1)]
    assert last.weight[held].abs().sum() == 0
    assert (last.bias[held[0::2]] == 0).all()  # the held shifts
    assert all((p == 0).all() for p in model.scorer[-1].parameters())
    with pytest.raises(SettingsError, match="residuals"):
        load_settings(overrides={"train.residuals": []}, environ={})


def test_reward_scaler_tracks_the_discounted_return() -> None:
    from dagsched.learner.train import RewardScaler

    rng = np.random.default_rng(0)
    rewards = rng.normal(-1.0, 0.5, 4000)
    dones = np.zeros(4000)
    dones[1999] = 1.0
    sc = RewardScaler(gamma=0.9, envs=2)
    for start in range(0, 4000, 500):  # in rollouts, as the trainer feeds it
        sc.update(0, rewards[start : start + 500], dones[start : start + 500])
    rets, r = [], 0.0
    for rew, done in zip(rewards, dones, strict=True):
        r = r * 0.9 + rew
        rets.append(r)
        if done:
            r = 0.0
    assert sc.std == pytest.approx(float(np.std(rets)), rel=1e-3)
    assert sc.ret[1] == 0.0  # the other simulator's return is its own


def test_critic_warmup_leaves_the_actor_as_imitated() -> None:
    kw = dict(seed=3, warm_start="heft_history", imitation_episodes=1, imitation_epochs=1)
    plain = train(_scenario(), TINY, updates=0, device=torch.device("cpu"), **kw)  # type: ignore[arg-type]
    hp = TINY.model_copy(update={"critic_warmup_updates": 1, "curriculum": False})
    warmed = train(_scenario(), hp, updates=0, device=torch.device("cpu"), **kw)  # type: ignore[arg-type]
    assert warmed.decisions == 64 and plain.decisions == 0
    a, b = plain.model.state_dict(), warmed.model.state_dict()
    changed = {k for k in a if not torch.equal(a[k], b[k])}
    assert changed and all(k.startswith("critic.") for k in changed)


def test_load_range_replaces_every_stage_load() -> None:
    from dagsched.learner.curriculum import Curriculum

    cur = Curriculum(ScenarioConfig(), workflows_per_episode=2, load=(0.8, 0.95))
    for progress in (0.0, 0.3, 1.0):
        cur.progress = progress
        loads = [cur(s)[0].workload.load for s in range(8)]
        assert all(0.8 <= x <= 0.95 for x in loads)


@pytest.mark.parametrize("through_trunk", [True, False])
def test_value_loss_reaches_the_encoder_only_when_asked(through_trunk: bool) -> None:
    """With zero advantages and no entropy bonus only the value loss has a gradient: it
    moves the shared encoder with `value_trunk_grad`, the value head alone without it."""
    from dagsched.learner.curriculum import Curriculum
    from dagsched.learner.train import _ppo_update, demonstrations
    from dagsched.policy.model import ActorCritic
    from dagsched.policy.normalizer import FeatureNormalizer

    obs, nodes, units = demonstrations(
        Curriculum(ScenarioConfig(), workflows_per_episode=2), 1, "heft", seed=0
    )
    obs, nodes, units = obs[:32], nodes[:32], units[:32]
    norm = FeatureNormalizer().fit(obs)
    torch.manual_seed(0)
    model = ActorCritic()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    n = len(obs)
    b = {
        "node": np.array(nodes),
        "unit": np.array(units, dtype=np.float32),
        "logprob": np.zeros(n, dtype=np.float32),
        "advantage": np.zeros(n),
        "return": np.full(n, 5.0),
    }
    hp = TrainSettings(update_epochs=1, ent_coef=0.0, value_trunk_grad=through_trunk)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    _ppo_update(model, opt, hp, [norm.transform(o) for o in obs], b, torch.device("cpu"))
    after = model.state_dict()
    changed = {k.split(".")[0] for k in after if not torch.equal(after[k], before[k])}
    assert "critic" in changed
    assert ("gat1" in changed) is through_trunk
    assert not changed & {"scorer", "cont_head", "prior"}
