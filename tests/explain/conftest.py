"""Fixtures for `dagsched explain`: the shipped champion, a real observation from the
simulator's default 32-node cluster, a private redis-server, and helpers that store decisions
the way the daemon does."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis

from dagsched.core.observation import Observation, observation_to_dict, observe
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.wire import to_message
from dagsched.daemon.redis_state import RedisState
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.messages import DecisionLogMsg, DecisionMsg
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view
from tests.learner.test_decision_log import logged_call

REPO = Path(__file__).resolve().parents[2]
CHAMPION = REPO / "models" / "champion"


def sim_observation(warmup: int = 150, seed: int = 0) -> tuple[Observation, list[str]]:
    """A decision point of the default scenario (32 nodes) after `warmup` least-loaded
    placement batches, so nodes are busy and the DAG is partly done."""
    sc = ScenarioConfig()
    sim = Simulator(sc, list(stream_workflows(sc, seed, 40)), seed=seed)
    policy = make_policy("least_loaded", seed)
    for _ in range(warmup):
        batch = sim.advance()
        assert batch is not None
        sim.apply(policy.decide(sim, batch), batch)
    batch = sim.advance()
    assert batch is not None
    view = cluster_view(sim)
    return observe(view, task_view(batch[0])), view.node_ids


@pytest.fixture(scope="session")
def champion() -> GNNScheduler:
    return load_bundle(CHAMPION, "v1")


@pytest.fixture(scope="session")
def sim_obs() -> tuple[Observation, list[str]]:
    return sim_observation()


@dataclass
class Stack:
    """One test's slice of Redis (its own key prefix) and the environment the CLI needs."""

    url: str
    prefix: str
    home: Path

    @property
    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url)

    @property
    def env(self) -> dict[str, str]:
        return {
            "DAGSCHED_REDIS_URL": self.url,
            "DAGSCHED_TOPIC_PREFIX": self.prefix,
            "DAGSCHED_HOME": str(self.home),
        }

    def key(self, kind: str, task_key: str, attempt: int) -> str:
        return f"{self.prefix}dagsched:{kind}:{task_key}:{attempt}"

    def store_gnn(
        self,
        sched: GNNScheduler,
        obs: Observation,
        node_ids: list[str],
        wf: str,
        task: int,
        attempt: int = 0,
        version: str = "v1",
        arm: str = "champion",
        decided_at: float = 1_796_000_000.0,
    ) -> DecisionMsg:
        """Decide like the daemon (the model on `obs`) and store decision + decision log."""
        p = sched.place_observations([obs])[0]
        unit, value = sched.last_units[0], sched.last_values[0]
        dec = DecisionMsg(
            workflow_id=wf, task=task, attempt=attempt, node=node_ids[p.node],
            cpu=float(np.clip(p.cpu, 0.1, 0.9)), mem=float(np.clip(p.mem, 0.2, 0.8)),
            max_retries=int(np.clip(round(p.max_retries), 1, 5)), model_version=version, arm=arm,
            log_prob=min(0.0, p.log_prob), decided_at=decided_at, latency_ms=2.0,
        )  # fmt: skip
        log = DecisionLogMsg(
            workflow_id=wf, task=task, attempt=attempt, model_version=version, arm=arm,
            node_index=p.node, unit=list(unit), log_prob=min(0.0, p.log_prob), value=value,
            decided_at=decided_at, observation=observation_to_dict(obs),
        )  # fmt: skip
        self._put(wf, task, attempt, dec, log)
        return dec

    def store_fallback(self, wf: str, task: int, node: str, attempt: int = 0) -> None:
        dec = DecisionMsg(
            workflow_id=wf, task=task, attempt=attempt, node=node, cpu=0.2, mem=0.3,
            max_retries=3, model_version="heuristic:least_loaded", arm="fallback",
            decided_at=1_796_000_000.0, latency_ms=1.0,
        )  # fmt: skip
        log = DecisionLogMsg(
            workflow_id=wf, task=task, attempt=attempt, model_version="heuristic:least_loaded",
            arm="fallback", node_index=0, decided_at=1_796_000_000.0, observation=None,
        )  # fmt: skip
        self._put(wf, task, attempt, dec, log)

    def store_batch(
        self, sched: GNNScheduler, view: ClusterView, tvs: list[TaskView]
    ) -> list[DecisionMsg]:
        """Decide `tvs` in one call of `sched` and store it the way the daemon does now: a
        decision per task, the workflows, and one `decision_batch` in the decision-log
        streams (written by the daemon's own `RedisState.put_decision_logs`)."""
        msg = logged_call(sched, view, tvs)
        decisions = []
        c = self.client
        for rec in msg.tasks:
            dec = DecisionMsg(
                workflow_id=rec.workflow_id, task=rec.task, attempt=rec.attempt,
                node=view.node_ids[rec.node_index], cpu=float(np.clip(rec.cpu, 0.1, 0.9)),
                mem=float(np.clip(rec.mem, 0.2, 0.8)), max_retries=3, model_version="v1",
                arm="champion", log_prob=rec.log_prob, decided_at=msg.decided_at,
                latency_ms=2.0,
            )  # fmt: skip
            c.set(self.key("dec", rec.task_key, rec.attempt), dec.encode())
            decisions.append(dec)
        for tv in tvs:
            c.set(f"{self.prefix}dagsched:wf:{tv.workflow.id}", to_message(tv.workflow).encode())
        settings = load_settings(None, {"topic_prefix": self.prefix, "redis_url": self.url}, {})
        keys = [f"{r.task_key}:{r.attempt}" for r in msg.tasks]

        async def put() -> None:
            client = aioredis.from_url(self.url)
            try:
                await RedisState(client, settings).put_decision_logs([(keys, msg.encode())])
            finally:
                await client.aclose()

        asyncio.run(put())
        return decisions

    def store_nodes(self, node_ids: list[str]) -> None:
        self.client.sadd(f"{self.prefix}dagsched:nodes", *node_ids)

    def _put(self, wf: str, task: int, attempt: int, dec: DecisionMsg, log: DecisionLogMsg) -> None:
        c = self.client
        c.set(self.key("dec", f"{wf}/{task}", attempt), dec.encode())
        c.set(self.key("obs", f"{wf}/{task}", attempt), log.encode())


@pytest.fixture
def stack(redis_url: str, tmp_path: Path) -> Stack:
    return Stack(redis_url, f"x{uuid.uuid4().hex[:10]}.", tmp_path / "home")


def dagsched(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """`python -m dagsched.cli.main ARGS` with a clean DAGSCHED_* environment plus `env`."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "dagsched.cli.main", *args],
        cwd=cwd,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=180,
    )
