"""Fixtures for `dagsched explain`: the shipped champion, a real observation from the
simulator's default 32-node cluster, a private redis-server, and helpers that store decisions
the way the daemon does."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
import redis
import redis.asyncio as aioredis

from dagsched.core.observation import Observation, observe
from dagsched.core.scheduler import Placement
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.wire import to_message
from dagsched.daemon.call_log import PolicyCall
from dagsched.daemon.redis_state import RedisState
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.messages import DecisionMsg, TaskReadyMsg
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view
from tests.learner.test_decision_log import logged_call

REPO = Path(__file__).resolve().parents[2]
CHAMPION = REPO / "models" / "champion"


def make_sim_point(warmup: int = 150, seed: int = 0) -> tuple[ClusterView, TaskView]:
    """A decision point of the default scenario (32 nodes) after `warmup` least-loaded
    placement batches, so nodes are busy and the DAG is partly done: the view and a ready
    task."""
    sc = ScenarioConfig()
    sim = Simulator(sc, list(stream_workflows(sc, seed, 40)), seed=seed)
    policy = make_policy("least_loaded", seed)
    for _ in range(warmup):
        batch = sim.advance()
        assert batch is not None
        sim.apply(policy.decide(sim, batch), batch)
    batch = sim.advance()
    assert batch is not None
    return cluster_view(sim), task_view(batch[0])


@pytest.fixture(scope="session")
def champion() -> GNNScheduler:
    return load_bundle(CHAMPION, "v1")


@pytest.fixture(scope="session")
def sim_point() -> tuple[ClusterView, TaskView]:
    return make_sim_point()


@pytest.fixture(scope="session")
def sim_obs(sim_point: tuple[ClusterView, TaskView]) -> tuple[Observation, list[str]]:
    view, tv = sim_point
    return observe(view, tv), view.node_ids


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

    def key(self, task_key: str, attempt: int) -> str:
        """The Redis key of a decision."""
        return f"{self.prefix}dagsched:dec:{task_key}:{attempt}"

    def store_gnn(
        self,
        sched: GNNScheduler,
        point: tuple[ClusterView, TaskView],
        wf: str,
        attempt: int = 0,
        version: str = "v1",
        arm: str = "champion",
        decided_at: float | None = None,
    ) -> DecisionMsg:
        """Decide the task of `point` like the daemon (one call of the model), as attempt
        `attempt` of a task of workflow `wf` (the point's workflow under that id), and store
        decision, workflow and decision log (`store_batch`)."""
        view, tv = point
        tv = replace(tv, workflow=replace(tv.workflow, id=wf), attempt=attempt)
        return self.store_batch(sched, view, [tv], version, arm, decided_at)[0]

    def store_fallback(
        self, wf: str, task: int, node: str, attempt: int = 0, decided_at: float | None = None
    ) -> None:
        """Store a decision of the heuristic fallback on `node` ("node-NNNN", index NNNN) as
        the daemon does: the decision, and a decision-log record with no view (nothing to
        replay)."""
        at = time.time() if decided_at is None else decided_at
        version = "heuristic:least_loaded"
        dec = DecisionMsg(
            workflow_id=wf, task=task, attempt=attempt, node=node, cpu=0.2, mem=0.3,
            max_retries=3, model_version=version, arm="fallback", decided_at=at, latency_ms=1.0,
        )  # fmt: skip
        self.client.set(self.key(f"{wf}/{task}", attempt), dec.encode())
        call = PolicyCall("fallback", version, at, None)
        m = TaskReadyMsg(workflow_id=wf, task=task, attempt=attempt)
        index = int(node.rsplit("-", 1)[1])
        call.add(m, None, Placement(index, 0.2, 0.3, 3), None)  # type: ignore[arg-type]
        call.new = [True]
        rec = call.record()
        assert rec is not None
        self._put_logs(*rec)

    def store_batch(
        self,
        sched: GNNScheduler,
        view: ClusterView,
        tvs: list[TaskView],
        version: str = "v1",
        arm: str = "champion",
        decided_at: float | None = None,
    ) -> list[DecisionMsg]:
        """Decide `tvs` in one call of `sched` and store it the way the daemon does now: a
        decision per task, the workflows, and one `decision_batch` in the decision-log
        streams (written by the daemon's own `RedisState.put_decision_logs`)."""
        msg = logged_call(sched, view, tvs)
        msg = msg.model_copy(
            update={
                "model_version": version,
                "arm": arm,
                "decided_at": msg.decided_at if decided_at is None else decided_at,
            }
        )
        decisions = []
        c = self.client
        for rec in msg.tasks:
            dec = DecisionMsg(
                workflow_id=rec.workflow_id, task=rec.task, attempt=rec.attempt,
                node=view.node_ids[rec.node_index], cpu=float(np.clip(rec.cpu, 0.1, 0.9)),
                mem=float(np.clip(rec.mem, 0.2, 0.8)), max_retries=3, model_version=version,
                arm=arm, log_prob=rec.log_prob, decided_at=msg.decided_at, latency_ms=2.0,
            )  # fmt: skip
            c.set(self.key(rec.task_key, rec.attempt), dec.encode())
            decisions.append(dec)
        for tv in tvs:
            c.set(f"{self.prefix}dagsched:wf:{tv.workflow.id}", to_message(tv.workflow).encode())
        self._put_logs([f"{r.task_key}:{r.attempt}" for r in msg.tasks], msg.encode())
        return decisions

    def expire_log(self, task_key: str, attempt: int) -> None:
        """Drop the decision-log record that holds this decision, as the daemon's trim does
        once the record passes its age or size cap."""
        token = f"{task_key}:{attempt}".encode()
        base = f"{self.prefix}dagsched:declog:"
        c = self.client
        ids = [i for i, f in c.xrange(base + "keys") if token in f[b"k"].split()]
        assert ids, f"no decision-log record holds {task_key}:{attempt}"
        for stream in ("keys", "recs"):
            c.xdel(base + stream, *ids)

    def store_nodes(self, node_ids: list[str]) -> None:
        self.client.sadd(f"{self.prefix}dagsched:nodes", *node_ids)

    def _put_logs(self, keys: list[str], raw: bytes) -> None:
        settings = load_settings(None, {"topic_prefix": self.prefix, "redis_url": self.url}, {})

        async def put() -> None:
            client = aioredis.from_url(self.url)
            try:
                await RedisState(client, settings).put_decision_logs([(keys, raw)])
            finally:
                await client.aclose()

        asyncio.run(put())


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
