"""Stopping drains and commits; Redis going away degrades service without losing input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dagsched.daemon.broker import ensure_topics
from dagsched.daemon.redis_server import RedisServer
from tests.daemon.conftest import Client, committed, end_offsets, make_settings, wait_for
from tests.daemon.test_roundtrip import http_get

REPO = Path(__file__).resolve().parents[2]


async def test_sigterm_drains_and_commits(settings, client: Client, tmp_path):
    await client.heartbeats(2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    env["DAGSCHED_TOPIC_PREFIX"] = settings.topic_prefix
    env["PYTHONPATH"] = str(REPO)
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
            str(tmp_path),
            "--metrics-port",
            "0",
            "--no-registry",
        ],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        for w in range(4):
            await client.workflow(f"wf-{w}")
            await client.ready(f"wf-{w}", 0)
        await client.wait("decisions", 4, timeout=90)
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


async def test_stop_mid_stream_commits_only_what_was_answered(settings, client, start_daemon):
    await client.heartbeats(2)
    d = await start_daemon()
    for w in range(10):
        await client.workflow(f"wf-{w}")
        await client.ready(f"wf-{w}", 0)
    await client.wait("decisions", 1)
    await d.stop()
    await client.wait("decisions", d.daemon.stats["decisions"])
    answered = len({(x.workflow_id, x.task) for x in client.got["decisions"]})
    # every committed task_ready has its decision on the topic (outputs before offsets)
    assert await committed(settings) <= 10 + answered


@pytest.fixture
async def own_redis(broker, tmp_path):
    server = RedisServer().start()
    s = make_settings(broker.bootstrap, server.url, tmp_path)
    await ensure_topics(s)
    yield server, s
    server.stop()


async def test_redis_outage_degrades_and_resyncs(own_redis, start_daemon):
    server, s = own_redis
    client = await Client(s).start()
    try:
        await client.heartbeats(3)
        d = await start_daemon(s)
        await client.workflow("wf-0", n_tasks=4)
        await client.ready("wf-0", 0)
        await client.wait("decisions", 1)
        server.stop()  # Redis goes away
        await client.ready("wf-0", 1)
        await client.ready("wf-0", 2)
        got = await client.wait("decisions", 3)
        assert {x.task for x in got} == {0, 1, 2}
        assert d.daemon.store.degraded
        status, body = await http_get(d.daemon.server.port, "/healthz")
        assert status == 200 and json.loads(body)["redis"] == "degraded"
        _, metrics = await http_get(d.daemon.server.port, "/metrics")
        assert b"dagsched_redis_up 0.0" in metrics
        # a redelivery during the outage still gets the same decision (from local memory)
        await client.ready("wf-0", 1)
        again = await client.wait("decisions", 4)
        raw = client.raw["decisions"]
        assert raw[next(i for i, x in enumerate(again[:3]) if x.task == 1)] == raw[3]
        server.start()  # Redis returns (empty: no persistence); the daemon resyncs
        await wait_for(lambda: not d.daemon.store.degraded, 20, "the resync")
        stored = await d.daemon.rs.stored_decisions([("wf-0/1", 0), ("wf-0/2", 0)])
        assert stored == [
            raw[next(i for i, x in enumerate(again[:3]) if x.task == t)] for t in (1, 2)
        ]
        await client.heartbeats(3)
        await client.ready("wf-0", 3)
        await client.wait("decisions", 5)
    finally:
        await client.close()
