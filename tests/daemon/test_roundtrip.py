"""A daemon over the real broker and Redis: tasks in, decisions out, offsets committed after."""

from __future__ import annotations

import asyncio
import json

from dagsched.schemas.messages import DecisionMsg
from tests.daemon.conftest import Client, committed, end_offsets, wait_for


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


async def test_tasks_get_decisions_and_offsets_follow(settings, client: Client, start_daemon):
    nodes = await client.heartbeats(4)
    d = await start_daemon()
    for w in range(3):
        await client.workflow(f"wf-{w}", n_tasks=3)
        await client.ready(f"wf-{w}", 0)
    decisions = await client.wait("decisions", 3)
    assert {(x.workflow_id, x.task, x.attempt) for x in decisions} == {
        (f"wf-{w}", 0, 0) for w in range(3)
    }
    for x in decisions:
        assert isinstance(x, DecisionMsg)
        assert x.node in nodes
        assert x.arm == "fallback" and x.model_version == "heuristic:least_loaded"
        assert 0.1 <= x.cpu <= 0.9 and 0.2 <= x.mem <= 0.8 and 1 <= x.max_retries <= 5
        assert x.latency_ms >= 0
    # every input (3 workflows + 3 task_ready) is committed, and only after its output
    total = await end_offsets(settings)
    assert total == 6
    await wait_for(lambda: committed(settings), what="a commit")
    await wait_for(lambda: _eq(committed(settings), total), what="all offsets committed")
    assert client.got["deadletter"] == []

    status, body = await http_get(d.daemon.server.port, "/metrics")
    assert status == 200
    text = body.decode()
    for name in (
        "dagsched_decisions_total",
        "dagsched_decision_latency_seconds_bucket",
        "dagsched_batch_size_bucket",
        "dagsched_dead_letters",
        "dagsched_consumer_lag",
        "dagsched_model_info",
        "dagsched_fallback_decisions_total",
        "dagsched_redis_state_age_seconds",
    ):
        assert name in text, name
    assert 'dagsched_decisions_total{arm="fallback"} 3.0' in text
    status, body = await http_get(d.daemon.server.port, "/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"


async def _eq(aw, value) -> bool:
    return (await aw) == value
