"""Stopping drains and commits; Redis going away degrades service without losing input. The
daemon serves the registered GNN throughout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from dagsched.daemon.broker import ensure_topics
from dagsched.daemon.redis_server import RedisServer
from dagsched.daemon.redis_state import RedisState
from dagsched.registry.store import Registry
from dagsched.schemas.messages import DeadLetterMsg, DecisionMsg, TaskReadyMsg, WorkflowMsg, decode
from dagsched.settings import Settings
from tests.conftest import clone_mlflow_home
from tests.daemon.conftest import (
    Client,
    committed,
    committed_offsets,
    end_offsets,
    http_get,
    make_settings,
    read_topic,
    wait_for,
)

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_sigterm_drains_and_commits(settings, champion: Registry, client: Client):
    await client.heartbeats(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    env["DAGSCHED_TOPIC_PREFIX"] = settings.topic_prefix
    env["PYTHONPATH"] = str(REPO)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagsched.cli.main",
            "--profile",
            "test",
            "--log-level",
            "INFO",
            "daemon",
            "--bootstrap",
            settings.kafka_bootstrap,
            "--redis-url",
            settings.redis_url,
            "--home",
            str(settings.home),
            "--metrics-port",
            str(port),
        ],
        env=env,
        cwd=settings.home,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:

        async def serving() -> bool:
            assert proc.poll() is None, "the daemon exited"
            try:
                _, body = await http_get(port, "/healthz")
            except OSError:
                return False  # not listening yet
            return bool(json.loads(body)["models"]["champion"] == "v1")

        await wait_for(serving, 90, "the daemon to serve the registered champion")
        for w in range(4):
            await client.workflow(f"wf-{w}")
            await client.ready(f"wf-{w}", 0)
        decisions = await client.wait("decisions", 4, timeout=90)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()[-2000:]
    events = [json.loads(line) for line in err.decode().splitlines() if line.startswith("{")]
    names = [e.get("event") for e in events]
    assert "daemon.stopping" in names and "daemon.stopped" in names
    assert await committed(settings) == await end_offsets(settings) == 8
    assert sorted((x.workflow_id, x.task) for x in decisions) == [(f"wf-{w}", 0) for w in range(4)]
    assert {(x.arm, x.model_version) for x in decisions} == {("champion", "v1")}
    assert client.got["deadletter"] == []


async def outcomes_before_offsets(settings: Settings, rstate: RedisState) -> tuple[int, int]:
    """Check that every committed input already has its outcome (a decision on the topic, a
    stored workflow, or a dead letter); return how many inputs and how many task_ready
    requests among them are committed."""
    offsets = await committed_offsets(settings)  # first the offsets, then the outcomes
    n = sum(offsets.values())
    inputs = await read_topic(settings, "tasks", at_least=n)
    decisions = await read_topic(settings, "decisions")
    dead = await read_topic(settings, "deadletter")
    decided = {
        (m.workflow_id, m.task, m.attempt)
        for rs in decisions.values()
        for m in (decode(r.value) for r in rs)
        if isinstance(m, DecisionMsg)
    }
    rejected = {
        (m.partition, m.offset)
        for rs in dead.values()
        for m in (decode(r.value) for r in rs)
        if isinstance(m, DeadLetterMsg)
    }
    requests = 0
    for p, records in inputs.items():
        for r in records:
            if r.offset >= offsets[p] or (p, r.offset) in rejected:
                continue
            msg = decode(r.value)
            if isinstance(msg, TaskReadyMsg):
                assert (msg.workflow_id, msg.task, msg.attempt) in decided, (p, r.offset, msg)
                requests += 1
            else:
                assert isinstance(msg, WorkflowMsg), msg
                assert (await rstate.get_workflows([msg.workflow_id]))[0] is not None, msg
    return n, requests


async def test_stop_mid_stream_commits_only_what_was_answered(
    settings, champion: Registry, client: Client, start_daemon, rstate: RedisState
):
    await client.heartbeats(2)
    d = await start_daemon(registry=True)
    await d.until_serving("champion", "v1")
    for w in range(10):
        await client.workflow(f"wf-{w}")
        await client.ready(f"wf-{w}", 0)
    await client.wait("decisions", 1)
    await outcomes_before_offsets(settings, rstate)  # while it serves
    await d.stop()
    _, answered = await outcomes_before_offsets(settings, rstate)
    # a restart answers the rest, from where the first one committed
    again = await start_daemon(registry=True)
    total = await end_offsets(settings)
    assert total == 20

    async def all_committed() -> bool:
        return await committed(settings) == total

    await wait_for(all_committed, 30, "every input committed")
    assert await outcomes_before_offsets(settings, rstate) == (20, 10)
    # every input got exactly one outcome: one decision per task, nothing dead-lettered
    stored = await read_topic(settings, "decisions", at_least=10)
    got = [decode(r.value) for rs in stored.values() for r in rs]
    per_task = Counter((x.workflow_id, x.task, x.attempt) for x in got)
    assert per_task == Counter({(f"wf-{w}", 0, 0): 1 for w in range(10)})
    assert {(x.arm, x.model_version) for x in got} == {("champion", "v1")}
    assert await read_topic(settings, "deadletter") == {}
    # the drain left nothing decided but uncommitted: the restart decided exactly the rest
    m = await again.metrics()
    assert m.value("dagsched_decisions_total") == 10 - answered
    assert m.value("dagsched_duplicate_decisions_total") == 0


@pytest.fixture
async def own_redis(broker, tmp_path, champion_template: Path):
    server = RedisServer().start()
    s = make_settings(broker.bootstrap, server.url, tmp_path)
    await ensure_topics(s)
    clone_mlflow_home(champion_template, s.home)
    yield server, s
    server.stop()


async def test_an_outage_longer_than_local_memory_holds_input_in_the_broker(
    broker, tmp_path, start_daemon
):
    """While Redis is away a replica decides from memory up to `daemon.caches.decisions`
    tasks, then holds the rest uncommitted; once Redis answers they are decided, once each."""
    server = RedisServer().start()
    s = make_settings(broker.bootstrap, server.url, tmp_path, **{"daemon.caches.decisions": 10})
    await ensure_topics(s)
    client = await Client(s).start()
    try:
        await client.heartbeats(3)
        d = await start_daemon(s)
        await client.workflow("wf-0", n_tasks=16)
        await client.ready("wf-0", 0)
        await client.wait("decisions", 1)
        server.stop()
        for task in range(1, 15):
            await client.ready("wf-0", task)

        async def held() -> bool:
            return (await d.metrics()).value("dagsched_batches_held_total") > 0

        await wait_for(held, 20, "a held batch")
        await client.poll()
        assert len(client.got["decisions"]) - 1 <= 10  # never more than it remembers
        assert await committed(s) < await end_offsets(s)  # the rest waits in the broker
        server.start()  # empty: the view comes back with the heartbeats
        await client.heartbeats(3)
        got = await client.wait("decisions", 15)
        assert sorted(x.task for x in got) == list(range(15))  # each decided once
        assert await read_topic(s, "deadletter") == {}
    finally:
        await client.close()
        server.stop()


async def test_redis_outage_degrades_and_resyncs(own_redis, start_daemon):
    server, s = own_redis
    client = await Client(s).start()
    try:
        await client.heartbeats(3)
        d = await start_daemon(s, registry=True)
        await d.until_serving("champion", "v1")
        await client.workflow("wf-0", n_tasks=4)
        await client.ready("wf-0", 0)
        await client.wait("decisions", 1)
        server.stop()  # Redis goes away
        await client.ready("wf-0", 1)
        await client.ready("wf-0", 2)
        got = await client.wait("decisions", 3)
        assert {x.task for x in got} == {0, 1, 2}
        health = await d.health()
        assert (health["status"], health["redis"]) == ("degraded", "degraded")
        assert (await d.metrics()).value("dagsched_redis_up") == 0
        # a redelivery during the outage still gets the same decision (from local memory)
        await client.ready("wf-0", 1)
        again = await client.wait("decisions", 4)
        raw = client.raw["decisions"]
        assert raw[next(i for i, x in enumerate(again[:3]) if x.task == 1)] == raw[3]
        server.start()  # Redis returns (empty: no persistence); the daemon resyncs

        async def resynced() -> bool:
            return (await d.health())["redis"] == "ok"

        await wait_for(resynced, 20, "the resync")
        assert (await d.metrics()).value("dagsched_redis_up") == 1
        redis = aioredis.from_url(s.redis_url)
        try:
            stored = await RedisState(redis, s).stored_decisions([("wf-0/1", 0), ("wf-0/2", 0)])
        finally:
            await redis.aclose()
        assert stored == [
            raw[next(i for i, x in enumerate(again[:3]) if x.task == t)] for t in (1, 2)
        ]
        await client.heartbeats(3)
        await client.ready("wf-0", 3)
        final = await client.wait("decisions", 5)
        # the model kept serving through the outage and after it
        assert {(x.arm, x.model_version) for x in final} == {("champion", "v1")}
    finally:
        await client.close()
