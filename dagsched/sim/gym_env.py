"""Gymnasium environment `dagsched/Cluster-v0`: one step places one ready task.

Observation (a Dict), from the one observation module the policy, the daemon and `explain`
use (`core.observation`): `nodes` [n_nodes, len(NODE_FEATURES)], `cluster`
[len(CLUSTER_FEATURES)] (cluster, task and family-history context), `anchor` [n_nodes, 4]
(heft_history's action per node, in the policy head's unit space) and `action_mask` (1
for alive nodes). The task's DAG, a graph of varying size, is not part of the Box
observation: `info` carries it (`dag` [n_tasks, len(DAG_FEATURES)], `edges` [2, E],
`task_idx`), so a graph policy can be trained on the environment too.

Action (a Dict): `node` (Discrete over nodes) and
`resources` = [CPU reservation 0.1-0.9, memory reservation 0.2-0.8, max retries 1-5,
priority in the node's queue 0-1].
A masked (dead) node in the action is replaced by the next alive node and reported in
`info["invalid_action"]`. The reward of a step is the sum of the per-decision rewards of every
attempt that ended since the previous step (credit arrives when outcomes are known).

Make it with `gymnasium.make("dagsched/Cluster-v0")` after `register_env()`, or with the
module-qualified id `"dagsched.sim.gym_env:dagsched/Cluster-v0"`, which imports this module.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from dagsched.core.bounds import ACTION_HIGH, ACTION_LOW, to_unit
from dagsched.core.observation import CLUSTER_FEATURES, NODE_FEATURES, Observation, observe
from dagsched.sim.config import ClusterConfig, ScenarioConfig, WorkloadConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import cluster_view, task_view
from dagsched.sim.workload import WorkloadGenerator

ENV_ID = "dagsched/Cluster-v0"


def _small_scenario() -> ScenarioConfig:
    return ScenarioConfig(
        cluster=ClusterConfig().scaled(8), workload=WorkloadConfig(workflows=10, size=(4, 12))
    )


class ClusterEnv(gym.Env[dict[str, np.ndarray], dict[str, Any]]):
    """Place tasks of simulated workflows, one per step, with the hybrid action."""

    metadata = {"render_modes": []}  # noqa: RUF012 - Gymnasium declares it this way

    def __init__(self, scenario: ScenarioConfig | None = None) -> None:
        self.scenario = scenario or _small_scenario()
        n = self.scenario.cluster.n_nodes
        self.observation_space = spaces.Dict(  # type: ignore[assignment]
            {
                "nodes": spaces.Box(-np.inf, np.inf, (n, len(NODE_FEATURES)), np.float32),
                "cluster": spaces.Box(-np.inf, np.inf, (len(CLUSTER_FEATURES),), np.float32),
                "anchor": spaces.Box(0.0, 1.0, (n, len(ACTION_LOW)), np.float32),
                "action_mask": spaces.MultiBinary(n),
            }
        )
        lo, hi = ACTION_LOW, ACTION_HIGH
        self.action_space = spaces.Dict(
            {"node": spaces.Discrete(n), "resources": spaces.Box(lo, hi, dtype=np.float32)}
        )
        self.sim: Simulator | None = None
        self._batch: list[TaskRun] = []
        self._reward = 0.0

    def _on_outcome(self, t: TaskRun, o: TaskOutcome, r: float) -> None:
        self._reward += r

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        gen = WorkloadGenerator(
            self.scenario.workload, self.scenario.cluster, self.np_random, self.scenario.truth
        )
        sim_seed = int(self.np_random.integers(2**31))
        self.sim = Simulator(
            self.scenario, gen.generate(), seed=sim_seed, on_outcome=self._on_outcome
        )
        self._reward = 0.0
        self._batch = []
        self._next_task()
        o = self._observation()
        return self._obs(o), _dag_info(o)

    def step(
        self, action: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        sim = self.sim
        if sim is None or not self._batch:
            raise RuntimeError("call reset() before step(), and again after the episode ends")
        task = self._batch.pop(0)
        node = int(action["node"])
        alive = sim.cluster.alive
        invalid = not (0 <= node < sim.cluster.n and alive[node])
        if invalid:
            node = next(
                i % sim.cluster.n
                for i in range(node + 1, node + 1 + sim.cluster.n)
                if alive[i % sim.cluster.n]
            )
        cpu, mem, retries, priority = (
            float(x) for x in np.asarray(action["resources"]).reshape(len(ACTION_LOW))
        )
        sim.place(Decision(task, node, cpu, mem, round(retries), priority))
        done = self._next_task()
        reward, self._reward = self._reward, 0.0
        o = self._observation()
        info: dict[str, Any] = {"invalid_action": invalid, **_dag_info(o)}
        if done:
            info["metrics"] = sim.summary()
        return self._obs(o), reward, done, False, info

    def _next_task(self) -> bool:
        """Advance to the next task needing a decision; True when the episode is over."""
        assert self.sim is not None
        while not self._batch:
            batch = self.sim.advance()
            if batch is None:
                return True
            self._batch = batch
        return False

    def _observation(self) -> Observation | None:
        """The shared observation of the task to place next (None once the episode ends)."""
        assert self.sim is not None
        if not self._batch:
            return None
        return observe(cluster_view(self.sim), task_view(self._batch[0], self.sim))

    def _obs(self, o: Observation | None) -> dict[str, np.ndarray]:
        assert self.sim is not None
        n = self.sim.cluster.n
        if o is None:
            nodes = np.zeros((n, len(NODE_FEATURES)), dtype=np.float32)
            cluster = np.zeros(len(CLUSTER_FEATURES), dtype=np.float32)
            anchor = np.zeros((n, len(ACTION_LOW)), dtype=np.float32)
        else:
            nodes, cluster, anchor = o.nodes, o.cluster, to_unit(o.base).clip(0.0, 1.0)
        return {
            "nodes": nodes,
            "cluster": cluster,
            "anchor": anchor,
            "action_mask": np.asarray(self.sim.cluster.alive, dtype=np.int8),
        }


def _dag_info(o: Observation | None) -> dict[str, Any]:
    """The task's DAG, for `info`: a graph of varying size has no Box space."""
    if o is None:
        return {}
    return {"dag": o.dag, "edges": o.edges, "task_idx": o.task_idx}


def register_env() -> None:
    """Register `dagsched/Cluster-v0` with Gymnasium (idempotent)."""
    if ENV_ID not in gym.registry:
        gym.register(id=ENV_ID, entry_point="dagsched.sim.gym_env:ClusterEnv")


# Gymnasium's "module:env-id" form imports this module and expects it to register the id.
register_env()
