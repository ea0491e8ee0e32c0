"""aiokafka clients configured the way dagsched uses them, and a produce-until-acked helper."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError

from dagsched.settings import Settings

log = structlog.get_logger(__name__)

# (topic, key, value)
Output = tuple[str, bytes | None, bytes]

BACKOFF_S = (0.1, 5.0)


def make_producer(settings: Settings) -> AIOKafkaProducer:
    """acks=all, no idempotence (Tansu lacks InitProducerId): at-least-once delivery."""
    return AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap,
        acks="all",
        enable_idempotence=False,
        linger_ms=0,
        request_timeout_ms=10_000,
        retry_backoff_ms=100,
    )


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
            futures = [
                await producer.send(topic, value=value, key=key) for topic, key, value in outputs
            ]
            if futures:
                await asyncio.gather(*futures)
            return True
        except KafkaError as exc:
            log.warning("kafka.produce_failed", error=str(exc), retry_in_s=backoff)
            if on_error is not None:
                on_error()
        if give_up_at is not None and time.monotonic() + backoff > give_up_at:
            return False
        await asyncio.sleep(backoff)  # broker away: reconnect with backoff
        backoff = min(backoff * 2, BACKOFF_S[1])
