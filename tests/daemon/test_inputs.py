"""Bad input goes to the dead-letter topic with its reason; redeliveries get the same decision."""

from __future__ import annotations

import json

import pytest

from dagsched.daemon.broker import ensure_topics
from dagsched.schemas.messages import (
    DeadLetterMsg,
    NodeHeartbeatMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    WorkflowMsg,
)
from tests.daemon.conftest import Client, committed, end_offsets, make_settings, wait_for

TASK = {"name": "a", "type": "cpu", "duration_s": 5, "cpu_cores": 1, "mem_gb": 1}


def workflow_json(**over) -> bytes:
    doc = {
        "schema_version": 1,
        "type": "workflow",
        "workflow_id": "bad",
        "tasks": [TASK, TASK],
        "edges": [[0, 1]],
        "deadline_s": 50,
    }
    doc.update(over)
    return json.dumps(doc).encode()


MALFORMED: list[tuple[bytes | None, str]] = [
    (b"{not json", "invalid JSON"),
    (b"\xff\xfe\x00", "invalid JSON"),
    (None, "empty message"),
    (b"[1, 2]", "expected a JSON object"),
    (
        b'{"schema_version": 99, "type": "task_ready", "workflow_id": "w", "task": 0}',
        "unknown schema_version 99",
    ),
    (b'{"type": "task_ready", "workflow_id": "w", "task": 0}', "missing schema_version"),
    (b'{"schema_version": 1, "type": "launch", "workflow_id": "w"}', "unknown message type"),
    (
        b'{"schema_version": 1, "type": "task_ready", "workflow_id": "w", "task": "0"}',
        "task_ready.task: Input should be a valid integer",
    ),
    (
        b'{"schema_version": 1, "type": "task_ready", "workflow_id": "w", "task": 0, "x": 1}',
        "task_ready.x: unknown field",
    ),
    (workflow_json(tasks=[{**TASK, "cpu_cores": -2}]), "workflow.tasks.0.cpu_cores"),
    (workflow_json(deadline_s=float("nan")), "invalid JSON"),
    (workflow_json(edges=[[0, 1], [1, 0]]), "has a cycle"),
    (workflow_json(edges=[[0, 7]]), "refers to a missing task"),
    (workflow_json(tasks=[TASK] * 9), "more than the 8 allowed"),
    (TaskReadyMsg(workflow_id="nobody", task=0).encode(), "unknown workflow 'nobody'"),
    (TaskReadyMsg(workflow_id="good", task=5).encode(), "out of range"),
    (b'{"schema_version": 1, "type": "node_down", "node": "n", "at": 0}', "does not belong"),
]


@pytest.fixture
async def small_dag_settings(broker, redis_url, tmp_path):
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"daemon.max_dag_tasks": 8})
    await ensure_topics(s)
    return s


async def test_every_malformed_kind_is_dead_lettered(small_dag_settings, start_daemon):
    s = small_dag_settings
    client = await Client(s).start()
    try:
        await client.heartbeats(2)
        await start_daemon(s)
        good = WorkflowMsg(
            workflow_id="good",
            deadline_s=9,
            tasks=[TaskSpecMsg(name="a", type="io", duration_s=1, cpu_cores=1, mem_gb=1)],
        )
        await client.send("tasks", good.encode(), "good")
        for raw, _ in MALFORMED:
            await client.producer.send_and_wait(s.topic("tasks"), raw, key=b"k")
        await client.ready("good", 0)  # the daemon keeps going after all of that
        dead = await client.wait("deadletter", len(MALFORMED))
        decisions = await client.wait("decisions", 1)
        assert [(d.workflow_id, d.task) for d in decisions] == [("good", 0)]
        assert len(dead) == len(MALFORMED)
        by_original = {d.original: d for d in dead}
        for raw, reason in MALFORMED:
            d: DeadLetterMsg = by_original[raw or b""]
            assert reason in d.reason, (reason, d.reason)
            assert d.topic == s.topic("tasks") and d.key_b64 == "aw=="
        total = await end_offsets(s)

        async def all_committed() -> bool:
            return await committed(s) == total

        await wait_for(all_committed, what="offsets past the bad input")
    finally:
        await client.close()


async def test_redelivered_task_gets_the_identical_decision(
    settings, client: Client, start_daemon, rstate
):
    await client.heartbeats(3)
    first = await start_daemon()
    await client.workflow("wf-a", n_tasks=2)
    await client.ready("wf-a", 0)
    await client.ready("wf-a", 0)  # redelivered at once (same batch or the next)
    await client.wait("decisions", 2)
    await first.stop()
    # a second daemon (a restart) sees the same task and attempt again
    await start_daemon()
    await client.ready("wf-a", 0)
    await client.ready("wf-a", 0, attempt=1)  # a new attempt is a new decision
    got = await client.wait("decisions", 4)
    same = [raw for raw, d in zip(client.raw["decisions"], got, strict=True) if d.attempt == 0]
    assert len(same) == 3 and len(set(same)) == 1  # byte-identical
    # ...and only one reservation was taken for attempt 0
    node = got[0].node
    ledger = await rstate.ledger(node)
    assert sum(1 for e in ledger if e["node"] == node) <= 2
    keys = [k async for k in rstate.redis.scan_iter(rstate.key("led", "wf-a/0:*"))]
    assert len(keys) == 2  # attempt 0 and attempt 1


DEEP = b"[" * 100_000 + b"]" * 100_000  # what one independent client sent


async def test_a_deeply_nested_record_is_dead_lettered_and_the_daemon_goes_on(
    settings, client: Client, start_daemon
):
    await client.heartbeats(2)
    running = await start_daemon()
    await client.send("tasks", DEEP, "deep")
    await client.send("events", DEEP, "deep")
    await client.workflow("after", n_tasks=1)
    await client.ready("after", 0)
    decisions = await client.wait("decisions", 1)
    assert [(d.workflow_id, d.task) for d in decisions] == [("after", 0)]
    dead = await client.wait("deadletter", 2)
    assert sorted(d.topic for d in dead) == [settings.topic("events"), settings.topic("tasks")]
    for d in dead:
        assert d.original == DEEP
        assert "nested deeper than" in d.reason, d.reason
    assert (await running.health())["status"] == "ok"
    # the updater is alive too: the one node that fits, heard of after the bad event, is used
    big = NodeHeartbeatMsg(node="node-big", at=0.0, kind="cpu", zone=0, cores=64, mem_gb=64)
    await client.send("events", big.encode(), "node-big")
    # the updater applies it (under a loaded run the daemon could otherwise decide the next
    # task on a view from before it, within its freshness wait)
    await wait_for(lambda: running.knows_nodes(3), what="the daemon to know node-big")
    await client.workflow("big", n_tasks=1, cores=40.0)
    await client.ready("big", 0)
    decisions = await client.wait("decisions", 2)
    assert decisions[-1].workflow_id == "big" and decisions[-1].node == "node-big"
