"""The Gymnasium environment passes Gymnasium's own checker and plays whole episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from dagsched.sim.gym_env import ENV_ID, ClusterEnv, register_env
from dagsched.sim.runs import TaskRun, TaskState


def test_check_env_passes() -> None:
    check_env(ClusterEnv(), skip_render_check=True)


def test_registered_and_plays_to_the_end() -> None:
    register_env()
    env = gym.make(ENV_ID)
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs)
    steps, total = 0, 0.0
    terminated = False
    info: dict = {}
    while not terminated:
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        total += float(reward)
        steps += 1
        assert not truncated
    m = info["metrics"]
    assert m["decisions"] == steps
    assert m["total_reward"] == np.float64(total) or abs(m["total_reward"] - total) < 1e-6


def _ready_task(env: ClusterEnv) -> TaskRun:
    """The one task the environment is asking about now (read from the simulator)."""
    assert env.sim is not None
    (task,) = [t for r in env.sim.active.values() for t in r.tasks if t.state == TaskState.READY]
    return task


@pytest.mark.parametrize(("asked", "lands"), [(3, 3), (0, 1)])
def test_the_action_reaches_the_simulator(asked: int, lands: int) -> None:
    """The chosen node, reservations and retries are what the simulator places; a dead node
    is replaced by the next alive one."""
    env = ClusterEnv()
    env.reset(seed=0)
    assert env.sim is not None
    env.sim.cluster.set_alive(0, False)
    task = _ready_task(env)
    cores, mem_gb = env.sim.cluster.cores[lands], env.sim.cluster.mem_gb[lands]
    action = {"node": asked, "resources": np.array([0.5, 0.25, 2.0, 0.7], np.float32)}
    _, _, _, _, info = env.step(action)
    assert info["invalid_action"] is (asked != lands)
    assert env.sim.metrics.decisions == 1
    assert (task.node, task.cpu, task.mem, task.max_retries) == (lands, 0.5, 0.25, 2)
    assert (task.res_cores, task.res_mem) == (0.5 * cores, 0.25 * mem_gb)
    assert task.state != TaskState.READY  # placed: running, queued, or already done


def test_same_seed_same_episode() -> None:
    def play(seed: int) -> list[float]:
        env = ClusterEnv()
        env.reset(seed=seed)
        env.action_space.seed(seed)
        rewards, done = [], False
        while not done:
            _, r, done, _, _ = env.step(env.action_space.sample())
            rewards.append(r)
        return rewards

    assert play(11) == play(11)
