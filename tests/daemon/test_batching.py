"""How the daemon forms batches: a task that finds the loop idle is decided at once;
`daemon.batch_wait_ms` is spent waiting for more only while input is queued (the loop found
records waiting, or the broker holds records it has not fetched yet)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

from aiokafka import TopicPartition

from dagsched.daemon.batch_loop import BatchLoop
from dagsched.daemon.broker import ensure_topics
from tests.daemon.conftest import Client, committed, make_settings, wait_for


async def _committed_at_least(s: Any, n: int) -> bool:
    return await committed(s) >= n


async def test_a_task_on_an_idle_topic_is_not_held_for_more_input(
    broker, redis_url, tmp_path, start_daemon
):
    # a batch that waited its full `batch_wait_ms` for more input would answer after 10 s
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"daemon.batch_wait_ms": 10_000})
    await ensure_topics(s)
    client = await Client(s).start()
    try:
        await client.heartbeats(2)
        await start_daemon(s)
        await client.workflow("wf-0", n_tasks=2)
        # the workflow handled (its offset committed) before the task is sent: a loop that
        # finds both waiting at once is busy, not idle, and rightly waits for more
        await wait_for(lambda: _committed_at_least(s, 1), 20, "the workflow's commit")
        began = time.monotonic()
        await client.ready("wf-0", 0)
        (decision,) = await client.wait("decisions", 1, timeout=9.5)
        assert decision.workflow_id == "wf-0" and decision.task == 0
        assert time.monotonic() - began < 9.5
        began = time.monotonic()
        await client.ready("wf-0", 1)  # the topic idle again: the next one too
        await client.wait("decisions", 2, timeout=9.5)
        assert time.monotonic() - began < 9.5
    finally:
        await client.close()


class _Consumer:
    """Records in chunks, as aiokafka's fetcher hands them out: `chunks[0]` is buffered when
    the loop asks (or arrives `first_after_s` later), each later chunk arrives while the loop
    waits for more. The broker's high watermark never says more is there."""

    def __init__(self, chunks: list[list[int]], first_after_s: float = 0.0) -> None:
        self.chunks = chunks
        self.first_after_s = first_after_s
        self.tp = TopicPartition("tasks", 0)
        self.handed = 0

    async def getmany(self, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        if self.handed == 0 and self.first_after_s:
            await asyncio.sleep(self.first_after_s)  # the topic idle: the fetch waits
        if not self.chunks or (timeout_ms == 0 and self.handed > 0):
            return {}
        chunk = self.chunks.pop(0)
        self.handed += len(chunk)
        return {self.tp: [SimpleNamespace(offset=o) for o in chunk]}

    def assignment(self) -> set[TopicPartition]:
        return {self.tp}

    def highwater(self, tp: TopicPartition) -> int:
        return self.handed

    async def position(self, tp: TopicPartition) -> int:
        return self.handed


def _loop(batch_max: int = 100) -> BatchLoop:
    loop = BatchLoop.__new__(BatchLoop)
    loop.cfg = SimpleNamespace(batch_max=batch_max, batch_wait_ms=200.0)  # type: ignore[assignment]
    return loop


async def test_a_busy_loop_waits_for_the_input_queued_behind_what_it_found():
    # records were waiting when the loop asked: more is likely behind them, worth a batch wait
    got = await _loop()._fetch(_Consumer([[0, 1], [2, 3, 4]]))
    assert [r.offset for r in got] == [0, 1, 2, 3, 4]


async def test_an_idle_loop_takes_what_arrived_without_waiting():
    got = await _loop()._fetch(_Consumer([[0, 1], [2, 3, 4]], first_after_s=0.05))
    assert [r.offset for r in got] == [0, 1]


async def test_a_lone_record_found_at_once_is_not_held_for_more():
    # the fetcher took an idle topic's one task while the loop was between calls: it is
    # handed out at once, but nothing is queued behind it (seen under load in the suite)
    got = await _loop()._fetch(_Consumer([[0], [1, 2]]))
    assert [r.offset for r in got] == [0]


async def test_a_batch_stops_at_batch_max():
    got = await _loop(batch_max=3)._fetch(_Consumer([[0, 1], [2]]))
    assert [r.offset for r in got] == [0, 1, 2]


class _Rs:
    """Redis whose decision-log write finishes only once the batch's outputs were produced."""

    def __init__(self, produced: asyncio.Event) -> None:
        self.produced = produced
        self.kept: list[Any] = []

    async def put_decision_logs(self, logs: list[Any]) -> None:
        await asyncio.wait_for(self.produced.wait(), 5.0)
        self.kept += logs


class _Committer:
    def __init__(self, rs: _Rs) -> None:
        self.rs = rs
        self.commits: list[tuple[dict[TopicPartition, int], int]] = []

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append((offsets, len(self.rs.kept)))  # and how many logs were kept then


async def test_outputs_are_produced_without_waiting_for_the_decision_log(monkeypatch):
    # the decisions are stored before `_finish`; the Redis decision log (for explain) is
    # written while they are produced, and the commit waits for both
    import dagsched.daemon.batch_loop as batch_mod

    produced = asyncio.Event()
    sent: list[Any] = []

    async def produce_all(producer, outputs, give_up_at=None, on_error=None):
        sent.extend(outputs)
        produced.set()
        return True

    monkeypatch.setattr(batch_mod, "produce_all", produce_all)
    rs = _Rs(produced)
    loop = BatchLoop.__new__(BatchLoop)
    loop.cfg = SimpleNamespace(grace_s=5.0)  # type: ignore[assignment]
    loop.stop_at = None
    loop.rs = rs  # type: ignore[assignment]
    loop.store = SimpleNamespace(degraded=False)  # type: ignore[assignment]
    loop.metrics = SimpleNamespace(  # type: ignore[assignment]
        kafka_errors=SimpleNamespace(inc=lambda: None),
        latency=SimpleNamespace(observe=lambda _x: None),
    )
    loop.stats = {"committed": 0}
    consumer = _Committer(rs)
    records = [SimpleNamespace(topic="tasks", partition=0, offset=o) for o in (7, 8)]
    outputs = [("decisions", b"wf", b"d7"), ("decisions", b"wf", b"d8")]
    await loop._finish(consumer, None, records, outputs, [(["wf/0:0"], b"log")], 2, 0.0)  # type: ignore[arg-type]
    assert sent == outputs
    assert consumer.commits == [({TopicPartition("tasks", 0): 9}, 1)]
    assert loop.stats["committed"] == 2


async def test_a_batch_reads_its_inputs_while_it_looks_up_stored_decisions():
    # the stored-decision lookup and the first round's reads (view, progress, history) are
    # two Redis round trips: neither waits for the other. Here the lookup answers only once
    # the reads have begun, and the reads only once the lookup has: in turn, they would hang.
    from dagsched.schemas.messages import TaskReadyMsg

    began = {"stored": asyncio.Event(), "inputs": asyncio.Event()}
    decided: list[Any] = []

    class _Store:
        async def put_workflows(self, items: list[Any]) -> None:
            pass

        async def stored(self, keys: list[Any]) -> list[Any]:
            began["stored"].set()
            await asyncio.wait_for(began["inputs"].wait(), 5.0)
            return [b"stored" if k == ("wf/1", 0) else None for k in keys]

    class _Placer:
        async def read_inputs(self, msgs: Any) -> Any:
            began["inputs"].set()
            await asyncio.wait_for(began["stored"].wait(), 5.0)
            return ("inputs", [m.task for m in msgs])

        async def decide(self, todo: Any, fetched: float, inputs: Any) -> Any:
            decided.append((sorted(todo), inputs))
            return {k: b"new" for k in todo}, set(todo), []

    loop = BatchLoop.__new__(BatchLoop)
    loop.settings = SimpleNamespace(topic=lambda name: name)  # type: ignore[assignment]
    loop.cfg = SimpleNamespace(  # type: ignore[assignment]
        max_dag_tasks=100, max_message_bytes=1 << 20, max_message_depth=32
    )
    loop.store = _Store()  # type: ignore[assignment]
    loop.placer = _Placer()  # type: ignore[assignment]
    loop.metrics = SimpleNamespace(duplicates=SimpleNamespace(inc=lambda: None))  # type: ignore[assignment]
    loop.stats = {"duplicates": 0}
    records = [
        SimpleNamespace(
            topic="tasks",
            partition=0,
            offset=t,
            key=b"wf",
            value=TaskReadyMsg(workflow_id="wf", task=t, attempt=0).encode(),
        )
        for t in (0, 1)
    ]
    outputs, fresh, _ = await loop.process(records, 0.0)  # type: ignore[arg-type]
    # task 1 was answered from the store; task 0 decided on the inputs read for both
    assert decided == [([("wf/0", 0)], ("inputs", [0, 1]))]
    assert outputs == [("decisions", b"wf", b"new"), ("decisions", b"wf", b"stored")]
    assert fresh == 1
