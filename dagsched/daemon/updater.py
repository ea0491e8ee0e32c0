"""The state updater: `dagsched.events` -> Redis (node state, reservations, DAG progress).

Runs inside each daemon process (one consumer group across replicas, so every event is
applied once per redelivery) or alone as `dagsched updater`. Each fetch (up to
`daemon.events_batch_max` records) is applied as one batch, in one atomic script call after one
read (`daemon.event_apply`), and its offsets are committed only then. Applying an event is
idempotent, so at-least-once delivery is enough. While Redis is unreachable it stops consuming
and retries the same batch with backoff; nothing is committed until it is applied. Events that
do not decode go to the dead-letter topic with their reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError
from redis.exceptions import RedisError

from dagsched.daemon.kafka import Output, dead_letter, make_consumer, produce_all
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.redis_state import RedisState
from dagsched.schemas.messages import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_DEPTH,
    BadMessage,
    NodeHeartbeatMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskStartedMsg,
    decode_fast,
)
from dagsched.schemas.topics import ALLOWED_TYPES
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

UPDATER_GROUP_SUFFIX = "-updater"
# how `encode` starts the common events: such a record is validated as that type straight away
# (what `decode` ends with), skipping the json.loads pass that is there to name what is wrong
# with a message; any failure goes through `decode` for that reason
FAST_EVENTS: tuple[tuple[bytes, type[Any]], ...] = tuple(
    (f'{{"schema_version":1,"type":"{t}",'.encode(), m)
    for t, m in (
        ("task_started", TaskStartedMsg),
        ("task_finished", TaskFinishedMsg),
        ("node_heartbeat", NodeHeartbeatMsg),
        ("task_failed", TaskFailedMsg),
    )
)


def decode_event(
    raw: bytes | None, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_MESSAGE_DEPTH
) -> Any:
    """`decode` within the limits, with the fast path for well-formed common events."""
    return decode_fast(raw, FAST_EVENTS, max_bytes, max_depth)


class Updater:
    """Consumes events and applies them to Redis; `run(stop)` until the event is set."""

    def __init__(
        self,
        settings: Settings,
        rs: RedisState,
        producer: AIOKafkaProducer,
        metrics: DaemonMetrics,
        consumer_options: dict[str, Any] | None = None,
    ) -> None:
        self.settings = settings
        self.rs = rs
        self.producer = producer
        self.metrics = metrics
        self.consumer_options = consumer_options or {}
        self.applied = 0
        self.redis_ok = True

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        group = s.topic_prefix + s.daemon.group_id + UPDATER_GROUP_SUFFIX
        options = {"max_poll_records": s.daemon.events_batch_max, **self.consumer_options}
        consumer = make_consumer(s, group, s.topic("events"), **options)
        backoff = 0.2
        while not stop.is_set():
            try:
                await consumer.start()
                break
            except KafkaError as exc:
                log.warning("updater.kafka_unreachable", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 10.0)
        else:
            return
        try:
            while not stop.is_set():
                try:
                    got = await consumer.getmany(timeout_ms=100)
                except KafkaError as exc:
                    log.warning("updater.fetch_failed", error=str(exc))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
                    continue
                records = [r for rs in got.values() for r in rs]
                if records and await self._apply(records, stop):
                    offsets: dict[TopicPartition, int] = {}
                    for r in records:
                        tp = TopicPartition(r.topic, r.partition)
                        offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
                    with contextlib.suppress(KafkaError):
                        await consumer.commit(offsets)
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _apply(self, records: list[Any], stop: asyncio.Event) -> bool:
        """Apply a fetched batch in order, in one step (retrying it whole while Redis is
        away); False if stopped first."""
        dead: list[Output] = []
        events = []
        for rec in records:
            try:
                msg = self.decode(rec)
            except BadMessage as exc:
                dead.append(self._dead(rec, exc.reason))
                continue
            events.append(msg)
        backoff = 0.1
        while events:
            try:
                await self.rs.apply_events(events)
            except RedisError as exc:
                if self.redis_ok:
                    log.warning("updater.redis_unreachable", error=str(exc))
                self.redis_ok = False
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                if stop.is_set():
                    return False
                backoff = min(backoff * 2, 5.0)
                continue
            if not self.redis_ok:
                log.info("updater.redis_back")
            self.redis_ok = True
            self.applied += len(events)
            self.metrics.events.inc(len(events))
            self.metrics.event_batches.inc()
            oldest = min((r.timestamp for r in records if r.timestamp is not None), default=None)
            if oldest is not None and oldest > 0:
                self.metrics.events_behind.set(max(0.0, time.time() - oldest / 1000))
            break
        if dead:
            return await produce_all(self.producer, dead, time.monotonic() + 30)
        return True

    def decode(self, rec: Any) -> Any:
        """The event in `rec`, or `BadMessage` with the reason it is dead-lettered for."""
        cfg = self.settings.daemon
        try:
            msg = decode_event(
                rec.value, max_bytes=cfg.max_message_bytes, max_depth=cfg.max_message_depth
            )
        except (RecursionError, MemoryError) as exc:  # no one record stops the updater
            raise BadMessage(f"message too complex to handle ({type(exc).__name__})") from None
        if msg.type not in ALLOWED_TYPES["events"]:
            raise BadMessage(f"a {msg.type} message does not belong on {rec.topic}")
        return msg

    def _dead(self, rec: Any, reason: str) -> Output:
        self.metrics.dead_letters.labels(kind="event").inc()
        log.warning("event.dead_letter", offset=rec.offset, partition=rec.partition, reason=reason)
        return dead_letter(self.settings, rec, reason)
