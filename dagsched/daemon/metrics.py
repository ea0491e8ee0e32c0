"""Prometheus metrics of one daemon (its own registry, so two daemons can share a process) and
a tiny asyncio HTTP server for `/metrics` and `/healthz`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

log = structlog.get_logger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class DaemonMetrics:
    """Every metric the daemon exports, on a private `CollectorRegistry`."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.decisions = Counter(
            "dagsched_decisions", "Decisions produced (new ones, by arm)", ["arm"], registry=r
        )
        self.duplicates = Counter(
            "dagsched_duplicate_decisions",
            "Redelivered or raced tasks answered with their stored decision",
            registry=r,
        )
        self.latency = Histogram(
            "dagsched_decision_latency_seconds",
            "From a task's fetch to its decision being acknowledged by the broker",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "dagsched_batch_size", "Records per micro-batch", buckets=BATCH_BUCKETS, registry=r
        )
        self.dead_letters = Counter(
            "dagsched_dead_letters", "Inputs sent to the dead-letter topic", ["kind"], registry=r
        )
        self.consumer_lag = Gauge(
            "dagsched_consumer_lag", "Records behind the high watermark, summed", registry=r
        )
        self.model_version = Gauge(
            "dagsched_model_info",
            "1 for the version serving each arm",
            ["arm", "version"],
            registry=r,
        )
        self.model_refused = Counter(
            "dagsched_model_refused", "Versions refused at load (checks failed)", registry=r
        )
        self.fallback = Counter(
            "dagsched_fallback_decisions",
            "Decisions made by the heuristic fallback",
            ["why"],
            registry=r,
        )
        self.redis_up = Gauge("dagsched_redis_up", "0 while serving last known state", registry=r)
        self.redis_age = Gauge(
            "dagsched_redis_state_age_seconds", "Seconds since Redis last answered", registry=r
        )
        self.kafka_errors = Counter(
            "dagsched_kafka_errors", "Broker errors (each retried with backoff)", registry=r
        )
        self.events = Counter(
            "dagsched_events_applied", "dagsched.events messages applied to Redis", registry=r
        )
        self.event_batches = Counter(
            "dagsched_event_batches",
            "batches of dagsched.events applied to Redis (one script call each)",
            registry=r,
        )
        self.events_behind = Gauge(
            "dagsched_events_behind_seconds",
            "age of the oldest event of the last batch applied, from its record timestamp",
            registry=r,
        )
        self.stale_views = Counter(
            "dagsched_stale_views_total",
            "batches decided on a view older than the request (daemon.view_wait_ms ran out)",
            registry=r,
        )
        self.held = Counter(
            "dagsched_batches_held_total",
            "times a batch was held uncommitted, to be retried: no alive node known, or Redis "
            "away with as many decisions to write back as daemon.caches.decisions",
            registry=r,
        )
        self.warmup = Gauge(
            "dagsched_warmup_seconds",
            "Seconds each version serving (or about to) took to place its warm-up batches",
            ["version"],
            registry=r,
        )
        self.redis_up.set(1)
        self.refresh: Callable[[], None] | None = None  # updates gauges just before a scrape

    def set_model(self, arm: str, version: str | None) -> None:
        """Show `version` as the one serving `arm` (clearing the previous one); None: the
        arm serves nothing now (its alias was removed)."""
        for labels in list(self.model_version._metrics):
            if labels[0] == arm:
                self.model_version.remove(*labels)
        if version is not None:
            self.model_version.labels(arm=arm, version=version).set(1)

    def set_warmup(self, version: str, seconds: float | None) -> None:
        """Show how long `version`'s warm-up took; None: drop it (it serves no more)."""
        if seconds is None:
            with contextlib.suppress(KeyError):
                self.warmup.remove(version)
        else:
            self.warmup.labels(version=version).set(seconds)

    def render(self) -> bytes:
        if self.refresh is not None:
            self.refresh()
        return generate_latest(self.registry)


class MetricsServer:
    """`GET /metrics` (Prometheus text) and `GET /healthz` (JSON; 503 unless healthy)."""

    def __init__(
        self,
        metrics: DaemonMetrics,
        health: Callable[[], dict[str, Any]],
        port: int,
        host: str = "0.0.0.0",
    ) -> None:
        self.metrics = metrics
        self.health = health
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("metrics.listening", port=self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readline(), 5.0)
            while (line := await asyncio.wait_for(reader.readline(), 5.0)) not in (b"\r\n", b""):
                del line  # headers are not needed
            parts = request.decode("latin-1").split()
            path = parts[1].split("?")[0] if len(parts) >= 2 else ""
            if path == "/metrics":
                status, ctype, body = 200, CONTENT_TYPE_LATEST, self.metrics.render()
            elif path == "/healthz":
                doc = self.health()
                status = 200 if doc.get("status") in ("ok", "degraded") else 503
                ctype, body = "application/json", json.dumps(doc).encode()
            else:
                status, ctype, body = 404, "text/plain", b"not found\n"
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[status]
            writer.write(
                f"HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
