"""The Gymnasium environment passes Gymnasium's own checker and plays whole episodes."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium.utils.env_checker import check_env

from dagsched.sim.gym_env import ENV_ID, ClusterEnv, register_env


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


def test_dead_node_in_action_is_remapped() -> None:
    env = ClusterEnv()
    env.reset(seed=0)
    assert env.sim is not None
    env.sim.cluster.set_alive(0, False)
    _, _, _, _, info = env.step({"node": 0, "resources": np.array([0.5, 0.5, 2.0], np.float32)})
    assert info["invalid_action"] is True


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
