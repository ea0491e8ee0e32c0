"""A job queue that speaks Kafka through confluent-kafka (librdkafka), not aiokafka.

Tasks, node heartbeats and one malformed record go in through confluent-kafka's Producer;
decisions and the dead letter come back through its Consumer in a consumer group, against the
embedded broker and a real daemon. librdkafka's default partitioner (CRC32) differs from the
Java clients' and aiokafka's (murmur2); `murmur2_random` makes a key land on the same partition
whichever client produced it, which the daemon relies on (a workflow and its tasks share one).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import Consumer, KafkaError, Message, Producer
from confluent_kafka import TopicPartition as CkTopicPartition

from dagsched.schemas.messages import (
    DeadLetterMsg,
    DecisionMsg,
    NodeHeartbeatMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    WorkflowMsg,
    decode,
)
from dagsched.settings import Settings
from tests.daemon.conftest import committed, end_offsets, wait_for

MALFORMED = b'{"schema_version": 1, "type": "task_ready", "workflow_id": "wf-1", "task": "0"}'


def producer(settings: Settings) -> Producer:
    return Producer(
        {
            "bootstrap.servers": settings.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": False,  # Tansu has no InitProducerId
            "partitioner": "murmur2_random",  # the partitions aiokafka and Java clients pick
            "linger.ms": 0,
        }
    )


class Sent:
    """Delivery reports of one confluent Producer: (topic, partition, offset) per key/value."""

    def __init__(self) -> None:
        self.acked: list[tuple[str, int, int, bytes | None, bytes | None]] = []
        self.errors: list[str] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))
        else:
            self.acked.append((msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value()))


async def produce(p: Producer, sent: Sent, topic: str, key: str, value: bytes) -> None:
    p.produce(topic, value=value, key=key.encode(), on_delivery=sent)
    # flush blocks on the broker's ack: off the event loop, where the daemon runs
    assert await asyncio.to_thread(p.flush, 10.0) == 0
    assert sent.errors == []


def murmur2_partition(key: bytes, partitions: int) -> int:
    parts = list(range(partitions))
    return int(DefaultPartitioner()(key, parts, parts))


def read(consumer: Consumer, want: int, timeout_s: float) -> list[Message]:
    """Consume until `want` records arrived (or the deadline); errors fail the test."""
    got: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=want - len(got), timeout=0.5):
            assert msg.error() is None, msg.error()
            got.append(msg)
    return got


async def test_confluent_kafka_producer_and_consumer_round_trip(
    settings: Settings, start_daemon: Any
) -> None:
    s = settings
    n_parts = s.topics.partitions
    p, sent = producer(s), Sent()
    nodes = [f"node-{i}" for i in range(3)]
    for i, node in enumerate(nodes):
        hb = NodeHeartbeatMsg(node=node, at=0.0, kind="cpu", zone=i, cores=16, mem_gb=64)
        await produce(p, sent, s.topic("events"), node, hb.encode())
    await start_daemon()

    workflows = ["wf-0", "wf-1"]
    for wf in workflows:
        msg = WorkflowMsg(
            workflow_id=wf,
            tasks=[
                TaskSpecMsg(name=f"t{i}", type="cpu", duration_s=10, cpu_cores=2, mem_gb=4)
                for i in range(3)
            ],
            edges=[(0, 1), (0, 2)],
            deadline_s=100.0,
        )
        await produce(p, sent, s.topic("tasks"), wf, msg.encode())
        await produce(p, sent, s.topic("tasks"), wf, TaskReadyMsg(workflow_id=wf, task=0).encode())
    await produce(p, sent, s.topic("tasks"), "wf-1", MALFORMED)
    tasks_acked = [a for a in sent.acked if a[0] == s.topic("tasks")]
    assert len(tasks_acked) == 5
    for _, partition, _, key, _ in sent.acked:
        assert key is not None and partition == murmur2_partition(key, n_parts)

    # Every input gets its outcome and is committed; after that no output can follow.
    total = await end_offsets(s, "tasks")
    assert total == 5

    async def all_committed() -> bool:
        return await committed(s, "tasks") == total

    await wait_for(all_committed, timeout=30, what="the daemon to commit every input")

    consumer = Consumer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "group.id": s.topic_prefix + "jobqueue",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 5,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
        }
    )
    try:
        consumer.subscribe([s.topic("decisions"), s.topic("deadletter")])
        records = await asyncio.to_thread(read, consumer, 3, 30.0)
        # the high watermarks say nothing more is there to read: exactly these three
        highs = {
            topic: sum(
                consumer.get_watermark_offsets(CkTopicPartition(topic, part), timeout=5)[1]
                for part in range(n_parts)
            )
            for topic in (s.topic("decisions"), s.topic("deadletter"))
        }
        assert highs == {s.topic("decisions"): 2, s.topic("deadletter"): 1}

        by_topic: dict[str, list[Message]] = {}
        for r in records:
            by_topic.setdefault(r.topic(), []).append(r)
        decisions = by_topic[s.topic("decisions")]
        assert len(decisions) == 2
        placed = []
        for r in decisions:
            d = decode(r.value())
            assert isinstance(d, DecisionMsg)
            assert r.key() == d.workflow_id.encode()
            assert r.partition() == murmur2_partition(r.key(), n_parts)
            assert d.node in nodes
            assert d.arm == "fallback" and d.model_version == "heuristic:least_loaded"
            placed.append((d.workflow_id, d.task, d.attempt))
        assert sorted(placed) == [("wf-0", 0, 0), ("wf-1", 0, 0)]

        (dead,) = by_topic[s.topic("deadletter")]
        letter = decode(dead.value())
        assert isinstance(letter, DeadLetterMsg)
        bad = next(a for a in sent.acked if a[4] == MALFORMED)
        assert letter.original == MALFORMED
        assert letter.key_b64 is not None and dead.key() == b"wf-1"
        assert (letter.topic, letter.partition, letter.offset) == bad[:3]
        assert letter.reason.startswith("task_ready.task: Input should be a valid integer")

        # the job queue's group commits through librdkafka, and the broker keeps it
        consumer.commit(asynchronous=False)
        parts = [
            CkTopicPartition(topic, part)
            for topic in (s.topic("decisions"), s.topic("deadletter"))
            for part in range(n_parts)
        ]
        done = await asyncio.to_thread(consumer.committed, parts, 10)
        # partitions the group never read report a negative sentinel
        assert sum(max(0, tp.offset) for tp in done) == 3
    finally:
        await asyncio.to_thread(consumer.close)
