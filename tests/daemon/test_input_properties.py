"""Properties of the daemon's handling of generated hostile batches, in process on the real
Redis (the broker's part is tests/daemon/test_nasty_input.py): every record of a batch gets
exactly one outcome, a decision or a dead letter with its reason (a valid workflow is stored
and answered by nothing), and the batch still decides the valid task that closes it."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.structs import ConsumerRecord
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagsched.core.wire import to_workflow
from dagsched.core.workflow import WorkflowError
from dagsched.daemon.batch_loop import decode_record
from dagsched.daemon.service import Daemon
from dagsched.schemas.messages import (
    BadMessage,
    DeadLetterMsg,
    DecisionMsg,
    NodeHeartbeatMsg,
    TaskReadyMsg,
    WorkflowMsg,
    decode,
)
from tests.bad_input import any_input, encode, inconsistent_records, task_ready, workflow
from tests.daemon.conftest import make_settings

OFFSETS = itertools.count()

batches = st.lists(
    st.one_of(any_input().map(lambda raw: [raw]), inconsistent_records()), min_size=1, max_size=6
).map(lambda groups: [raw for group in groups for raw in group])


@pytest.fixture
def daemon(redis_url: str, tmp_path: Path) -> Iterator[tuple[asyncio.Runner, Daemon]]:
    """A daemon that is not consuming (no broker): its batch loop, on the real Redis, with
    four nodes alive."""
    s = make_settings("127.0.0.1:9", redis_url, tmp_path)
    with asyncio.Runner() as runner:
        d = Daemon(s, registry=False)

        async def nodes() -> None:
            for i in range(4):
                hb = NodeHeartbeatMsg(
                    node=f"n{i}", at=0.0, kind="cpu", zone=0, cores=64, mem_gb=256
                )
                await d.rs.apply_event(hb)

        runner.run(nodes())
        yield runner, d
        runner.run(d.redis.aclose())


def record(topic: str, value: bytes | None) -> ConsumerRecord[bytes, bytes]:
    size = -1 if value is None else len(value)
    return ConsumerRecord(topic, 0, next(OFFSETS), 0, 0, b"k", value, None, 1, size, ())


def expected_reason(raw: bytes | None, topic: str, max_tasks: int) -> str | None:
    """Why the daemon must dead-letter `raw` whatever it holds (None: it depends on state)."""
    try:
        msg = decode_record(raw)
    except BadMessage as exc:
        return exc.reason
    if isinstance(msg, WorkflowMsg):
        try:
            to_workflow(msg, max_tasks)
        except WorkflowError as exc:
            return str(exc)
        return None
    if isinstance(msg, TaskReadyMsg):
        return None
    return f"a {msg.type} message does not belong on {topic}"


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(batches)
def test_every_record_gets_one_outcome_and_the_valid_task_is_decided(daemon, raws):
    runner, d = daemon
    topic = d.settings.topic("tasks")
    last = next(OFFSETS)
    raws = [*raws, encode(workflow(f"ok-{last}", 2)), encode(task_ready(f"ok-{last}", 0))]
    records = [record(topic, raw) for raw in raws]
    outputs, _, _ = runner.run(d.batches.process(records, 0.0))

    dead: dict[int, list[DeadLetterMsg]] = {}
    decided: dict[tuple[str, int, int], int] = {}
    for out_topic, _, value in outputs:
        msg: Any = decode(value)
        if out_topic == d.settings.topic("deadletter"):
            dead.setdefault(msg.offset, []).append(msg)
        elif out_topic == d.settings.topic("decisions"):
            assert isinstance(msg, DecisionMsg)
            key = (msg.workflow_id, msg.task, msg.attempt)
            decided[key] = decided.get(key, 0) + 1
    answered: dict[tuple[str, int, int], int] = {}
    for rec in records:
        got = dead.pop(rec.offset, [])
        assert len(got) <= 1, got
        reason = expected_reason(rec.value, topic, d.cfg.max_dag_tasks)
        if reason is not None:
            assert [g.reason for g in got] == [reason]
            assert got[0].original == (rec.value or b"") and got[0].topic == topic
            continue
        msg = decode_record(rec.value)
        if isinstance(msg, WorkflowMsg):
            assert not got, got  # stored: no output
        elif got:
            assert "unknown workflow" in got[0].reason or "out of range" in got[0].reason
        else:
            key = (msg.workflow_id, msg.task, msg.attempt)
            answered[key] = answered.get(key, 0) + 1
    assert not dead, f"dead letters for no record: {dead}"
    assert decided == answered  # one decision per task record, none for anything else
    assert decided.get((f"ok-{last}", 0, 0)) == 1
