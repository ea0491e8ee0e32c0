"""aiokafka clients configured the way dagsched uses them, and a produce-until-acked helper."""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.partitioner import DefaultPartitioner

from dagsched.schemas.messages import DEAD_LETTER_HEAD_BYTES, DeadLetterMsg
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

# (topic, key, value)
Output = tuple[str, bytes | None, bytes]

BACKOFF_S = (0.1, 5.0)


def max_record_bytes(settings: Settings) -> int:
    """The largest record a dagsched process produces: the dead letter of an input at the size
    limit (its value and key in base64, the key again as the record's key), with room for the
    other fields. A broker refusing it would hold the batch (`produce_all` retries)."""
    return settings.daemon.max_message_bytes * 7 // 3 + 1024 * 1024


def make_producer(settings: Settings) -> AIOKafkaProducer:
    """acks=all, no idempotence (Tansu lacks InitProducerId): at-least-once delivery. Its
    key -> partition map (`_send`) holds `daemon.caches.partition_keys` keys per topic."""
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=False,
        linger_ms=0,
        request_timeout_ms=10_000,
        retry_backoff_ms=100,
        max_request_size=max_record_bytes(settings),
    )
    _PARTITIONS[producer] = _Partitions(settings.daemon.caches.partition_keys)
    return producer


def dead_letter(settings: Settings, rec: Any, reason: str) -> Output:
    """The dead-letter record for input `rec` rejected for `reason`, keyed as `rec` was: the
    whole record when it is within `daemon.max_message_bytes`, else only its head."""
    size = len(rec.value or b"") + len(rec.key or b"")
    whole = size <= settings.daemon.max_message_bytes
    msg = DeadLetterMsg.of(
        rec.value, rec.key, rec.topic, rec.partition, rec.offset, reason, time.time(), whole=whole
    )
    key = rec.key if whole or rec.key is None else rec.key[:DEAD_LETTER_HEAD_BYTES]
    return (settings.topic("deadletter"), key, msg.encode())


def make_consumer(
    settings: Settings, group_id: str | None, *topics: str, **options: Any
) -> AIOKafkaConsumer:
    """Manual commits, earliest reset, and a short fetch wait (`daemon.fetch_max_wait_ms`)."""
    opts: dict[str, Any] = {
        "bootstrap_servers": settings.kafka_bootstrap,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "fetch_max_wait_ms": settings.daemon.fetch_max_wait_ms,
        "max_poll_records": settings.daemon.batch_max,
        "retry_backoff_ms": 100,
    }
    opts.update(options)
    return AIOKafkaConsumer(*topics, **opts)


async def produce_all(
    producer: AIOKafkaProducer,
    outputs: Sequence[Output],
    give_up_at: float | None = None,
    on_error: Any = None,
) -> bool:
    """Send every output and wait for all acks, retrying the whole set with backoff.

    Returns False only when `give_up_at` (a `time.monotonic()` deadline) passes first. A retry
    may duplicate records already acked: consumers of dagsched topics tolerate that.
    """
    backoff = BACKOFF_S[0]
    while True:
        try:
            for fut in await _send(producer, outputs):
                await fut  # all were sent before the first wait
            return True
        except KafkaError as exc:
            log.warning("kafka.produce_failed", error=str(exc), retry_in_s=backoff)
            if on_error is not None:
                on_error()
        if give_up_at is not None and time.monotonic() + backoff > give_up_at:
            return False
        await asyncio.sleep(backoff)  # broker away: reconnect with backoff
        backoff = min(backoff * 2, BACKOFF_S[1])


async def _send(producer: AIOKafkaProducer, outputs: Sequence[Output]) -> list[Any]:
    """Queue `outputs` as one record batch per partition (in order within each), partitioned
    as `producer.send` would (the default partitioner: murmur2 of the key, a random partition
    without one); their delivery futures. Per record, `send` costs a metadata check, a
    pure-Python murmur2 and a future of its own: a batch of 64 decisions spent more in it than
    in deciding them with the heuristic."""
    groups: dict[tuple[str, int], list[tuple[bytes | None, bytes]]] = {}
    futures = []
    partitions = _PARTITIONS.get(producer)
    if partitions is None:  # a producer `make_producer` did not make: the default bound
        partitions = _PARTITIONS[producer] = _Partitions()
    for topic, key, value in outputs:
        partition = partitions.partition(producer, topic, key)
        if partition is None:  # no metadata yet: `send` waits for it
            futures.append(await producer.send(topic, value=value, key=key))
            continue
        groups.setdefault((topic, partition), []).append((key, value))
    for (topic, partition), records in groups.items():
        batch = producer.create_batch()
        for key, value in records:
            if batch.append(key=key, value=value, timestamp=None) is None:  # full: the next
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = producer.create_batch()
                batch.append(key=key, value=value, timestamp=None)  # a first record fits
        futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


class _Partitions:
    """Key -> partition as aiokafka's default partitioner picks it, remembered per topic and
    partition count (a batch's decisions share few workflow ids; murmur2 is pure Python),
    cleared when it holds `cap` keys."""

    def __init__(self, cap: int = 100_000) -> None:
        self.cap = cap
        self.known: dict[tuple[str, int], tuple[list[int], dict[bytes, int]]] = {}
        self.hash = DefaultPartitioner()

    def partition(self, producer: AIOKafkaProducer, topic: str, key: bytes | None) -> int | None:
        parts = producer.client.cluster.partitions_for_topic(topic)
        if not parts:
            return None
        known = self.known.get((topic, len(parts)))
        if known is None:
            known = self.known[(topic, len(parts))] = (sorted(parts), {})
        if key is None:
            available = producer.client.cluster.available_partitions_for_topic(topic)
            return int(self.hash(None, known[0], list(available or ())))
        hit = known[1].get(key)
        if hit is None:
            if len(known[1]) >= self.cap:
                known[1].clear()
            hit = known[1][key] = int(self.hash(key, known[0], known[0]))
        return hit


# each producer's map, kept while the producer is
_PARTITIONS: weakref.WeakKeyDictionary[AIOKafkaProducer, _Partitions] = weakref.WeakKeyDictionary()
