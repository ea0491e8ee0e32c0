"""A sample of the nastiest input, through the real broker to a real daemon: each record gets
exactly one outcome (a decision, or a dead letter with its reason), and the daemon still
decides the valid task sent after all of them. The many other cases are generated in process
(tests/schemas/test_decode_properties.py, tests/daemon/test_input_properties.py)."""

from __future__ import annotations

from collections import Counter

from aiokafka import AIOKafkaProducer

from dagsched.schemas.messages import DeadLetterMsg, DecisionMsg, decode
from dagsched.settings import Settings
from tests.bad_input import encode, task_ready, task_spec, workflow
from tests.daemon.conftest import Client, committed, end_offsets, read_topic, wait_for

DEEP = b"[" * 100_000 + b"]" * 100_000


def ten_megabytes() -> bytes:
    """A workflow of 100,000 tasks, padded with whitespace to 10 MB."""
    body = b",".join([encode(task_spec())] * 100_000)
    raw = b'{"schema_version":1,"type":"workflow","workflow_id":"big","tasks":[%s]}' % body
    return raw + b" " * (10_000_000 - len(raw))


def cyclic() -> bytes:
    return encode(workflow("cyc", 3, [(0, 1), (1, 2), (2, 0)]))


def unicode_names() -> bytes:
    doc = workflow("uni", 2)
    doc["tasks"] = [task_spec("задача-✓"), task_spec("🚀 数据")]
    return encode(doc)


# (topic, value, what must come of it: a fragment of the dead letter's reason, or "decision")
SAMPLE: list[tuple[str, bytes | None, str]] = [
    ("tasks", DEEP, "nested deeper than the limit of 32 levels"),
    ("tasks", ten_megabytes(), "message of 10000000 bytes is over the size limit"),
    ("tasks", encode(workflow("nan", 2)).replace(b":100.0", b":NaN"), "NaN is not a number"),
    ("tasks", cyclic(), "has a cycle"),
    ("tasks", encode(task_ready("cyc", 0)), "unknown workflow 'cyc'"),
    ("tasks", encode({**workflow("x", 1), "workflow_id": "wf-ü✓"}), "workflow.workflow_id"),
    ("tasks", unicode_names(), "stored"),
    ("tasks", encode(task_ready("uni", 1)), "decision"),
    ("tasks", encode(task_ready("uni", 7)), "out of range"),
    ("tasks", encode(task_ready("uni", 10**30)), "task_ready.task"),
    ("tasks", b'{"schema_version":1,"type":[]}', "unknown message type"),
    ("tasks", b"\xff\x00garbage", "invalid JSON"),
    ("tasks", None, "empty message"),
    ("events", DEEP, "nested deeper than the limit of 32 levels"),
    ("events", b'{"schema_version":1,"type":"node_down","node":"n","at":Infinity}', "Infinity"),
]  # fmt: skip


async def test_each_nasty_record_gets_one_outcome_and_the_daemon_goes_on(
    settings: Settings, client: Client, start_daemon
):
    running = await start_daemon()
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap, acks="all", max_request_size=16 * 1024 * 1024
    )
    await producer.start()
    try:
        where = []
        for topic, value, _ in SAMPLE:
            meta = await producer.send_and_wait(settings.topic(topic), value, key=b"nasty")
            where.append((meta.topic, meta.partition, meta.offset))
    finally:
        await producer.stop()
    # nodes only now: the batch with the valid task waits for them, and is processed again
    await client.heartbeats(2)
    await client.workflow("after", n_tasks=1)
    await client.ready("after", 0)

    def decided_after() -> bool:
        return any(d.workflow_id == "after" for d in client.got["decisions"])

    async def settled() -> bool:
        await client.poll()
        return decided_after() and await committed(settings) == await end_offsets(settings)

    await wait_for(settled, 30, "the valid task after the sample, and every offset committed")
    expected_dead = sum(1 for _, _, want in SAMPLE if want not in ("decision", "stored"))
    records = await read_topic(settings, "deadletter", at_least=expected_dead)
    dead = [decode(r.value) for recs in records.values() for r in recs]
    by_place = Counter((d.topic, d.partition, d.offset) for d in dead)
    assert sum(by_place.values()) == expected_dead  # one per bad record, none for the rest
    decisions = [
        (d.workflow_id, d.task)
        for recs in (await read_topic(settings, "decisions")).values()
        for d in map(decode, (r.value for r in recs))
        if isinstance(d, DecisionMsg)
    ]
    assert sorted(decisions) == [("after", 0), ("uni", 1)]
    for (topic, value, want), place in zip(SAMPLE, where, strict=True):
        got = [d for d in dead if (d.topic, d.partition, d.offset) == place]
        if want in ("decision", "stored"):
            assert got == [], (topic, want, got)
            continue
        assert len(got) == 1, (topic, want)
        letter: DeadLetterMsg = got[0]
        assert want in letter.reason, (want, letter.reason)
        if letter.original_size is None:
            assert letter.original == (value or b"")
        else:  # over the size limit: its head, and its size
            assert letter.original_size == len(value or b"")
            assert (value or b"").startswith(letter.original)
    health = await running.health()
    assert health["status"] == "ok"
    metrics = await running.metrics()  # each counted once, however often a batch was held
    assert metrics.value("dagsched_dead_letters_total") == expected_dead
