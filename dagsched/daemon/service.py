"""The scheduling daemon: `dagsched.tasks` in, decisions (or dead letters) out, offsets after.

Lifecycle (after arq's worker): clients are built once in `async_run`, a stop event ends the
loop, the batch in flight drains within `daemon.grace_s`, and `close` always runs. `run()` is
for production (SIGTERM / SIGINT set the stop event); tests drive `async_run()` and `stop()`.
Also here: Kafka start with backoff, the rebalance listener and `/healthz`.

Readiness: `/healthz` says `starting` (503) until the daemon decides with what it will serve,
at its warm speed: the first registry check is done and what it loaded is installed (a
registry that does not answer ends the check: the heuristic serves), every scheduler it
serves has placed its warm-up batches (`daemon.warmup`), and the consumer has joined its
group (its first assignment, which may be empty). The group join runs while the model loads
and warms, so readiness costs start-up no extra time. Once ready it stays so (a reload
warms the new version before it swaps it in). While a load takes longer than
`daemon.grace_s`, the heuristic decides what arrives meanwhile, and the daemon is not ready.

What one batch does, and why it is effectively once, is `dagsched.daemon.batch_loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis
import structlog
from aiokafka import ConsumerRebalanceListener
from aiokafka.errors import KafkaError

from dagsched.core.wire import to_workflow
from dagsched.core.workflow import Workflow
from dagsched.daemon.arms import ALIASES, Loader, Models, VersionOf
from dagsched.daemon.batch_loop import BatchLoop
from dagsched.daemon.kafka import make_consumer, make_producer
from dagsched.daemon.metrics import DaemonMetrics, MetricsServer
from dagsched.daemon.redis_state import RedisState, connect
from dagsched.daemon.state_store import StateStore
from dagsched.daemon.updater import Updater
from dagsched.registry import serving
from dagsched.schemas.messages import BadMessage, WorkflowMsg, decode
from dagsched.settings import Settings

log = structlog.get_logger(__name__)


def set_torch_threads(settings: Settings) -> None:
    """Give this process `daemon.torch_threads` compute threads (0: leave the libraries'
    defaults): torch's intra-op pool, and numpy's BLAS and OpenMP pools for the whole process.
    Replicas share the host's cores and scale by processes; a BLAS pool of a thread per core,
    its threads spinning after each product, made two replicas on 2 cores slower than one."""
    n = settings.daemon.torch_threads
    if n:
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=n)  # every BLAS and OpenMP library loaded so far
        import torch

        torch.set_num_threads(n)
        threadpool_limits(limits=n)  # and those torch brought


class _Listener(ConsumerRebalanceListener):
    """Rebalances: commit the batch in flight before partitions move; log the assignment."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def on_partitions_revoked(self, revoked: Any) -> None:
        """Wait (up to the grace period) for the batches in flight to commit."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.daemon.settings.daemon.grace_s):
                async with self.daemon.batches.batch_lock:
                    await self.daemon.batches.drain()
        log.info("partitions.revoked", partitions=sorted(str(tp) for tp in revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        """Log the assignment and wake whoever awaits `Daemon.assigned`."""
        log.info("partitions.assigned", partitions=sorted(str(tp) for tp in assigned))
        self.daemon.assigned.set()


class Daemon:
    """One replica. Several in one consumer group share the partitions of `dagsched.tasks`.

    `freeze_gc` (the `dagsched daemon` process sets it): after start-up and after each model
    swap, what is alive is moved out of the garbage collector's sight (`gc.freeze`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        redis: aioredis.Redis | None = None,
        metrics_port: int | None = None,
        run_updater: bool = True,
        consumer_options: dict[str, Any] | None = None,
        registry: bool = True,
        loader: Loader | None = None,
        version_of: VersionOf | None = None,
        freeze_gc: bool = False,
    ) -> None:
        self.settings = settings
        self.cfg = settings.daemon
        self.metrics = DaemonMetrics()
        self.registry = registry
        self.models = Models(
            settings,
            self.metrics,
            loader=loader or serving.load_alias,
            version_of=version_of or serving.alias_version,
        )
        self._own_redis = redis is None
        self.redis = redis if redis is not None else connect(settings)
        self.rs = RedisState(self.redis, settings)
        self.store = StateStore(self.rs, self._parse_workflow, settings.daemon.caches)
        self.metrics_port = self.cfg.metrics_port if metrics_port is None else metrics_port
        self.run_updater = run_updater
        self.consumer_options = consumer_options or {}
        self.stop_event = asyncio.Event()
        self.assigned = asyncio.Event()  # set once partitions are assigned (tests await it)
        self.warm = False  # every scheduler serving at start has been warmed
        self.server: MetricsServer | None = None
        self.consumer: Any = None
        self.updater: Updater | None = None
        self.stats: dict[str, int] = defaultdict(int)
        self.batches = BatchLoop(
            settings, self.rs, self.store, self.models, self.metrics, self.stats, self.stop_event
        )
        self.batches.freeze_gc = freeze_gc
        self.metrics.refresh = self.batches.gauges

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the daemon to drain and exit (what SIGTERM does)."""
        if self.batches.stop_at is None:
            self.batches.stop_at = time.monotonic()
            log.info("daemon.stopping", grace_s=self.cfg.grace_s)
        self.stop_event.set()

    async def async_run(self) -> None:
        """Serve until `stop()`; always closes what it opened."""
        s = self.settings
        producer = make_producer(s)
        consumer = make_consumer(s, s.topic_prefix + self.cfg.group_id, **self.consumer_options)
        self.consumer = consumer
        tasks: list[asyncio.Task[None]] = []
        self.server = MetricsServer(self.metrics, self.health, self.metrics_port)
        try:
            await self.server.start()
            await self._start_kafka(producer, "producer")
            consumer.subscribe([s.topic("tasks")], listener=_Listener(self))
            await self._start_kafka(consumer, "consumer")
            if self.run_updater:  # first: events are applied while a model loads
                self.updater = Updater(
                    s, self.rs, producer, self.metrics, consumer_options=self.consumer_options
                )
                tasks.append(asyncio.create_task(self.updater.run(self.stop_event)))
            if self.registry:
                tasks.append(asyncio.create_task(self.models.watch(self.stop_event, self.redis)))
                # serve the champion from the first batch when the registry answers in time;
                # otherwise start on the fallback and swap when the load completes
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.models.first_check.wait(), self.cfg.grace_s)
                self.models.swap()
            await self.models.warm_fallback()
            self.warm = True
            if self.batches.freeze_gc:
                gc.collect()
                gc.freeze()  # see BatchLoop.freeze_gc
            log.info("daemon.started", group=s.topic_prefix + self.cfg.group_id)
            await self.batches.run(consumer, producer)
        finally:
            self.stop_event.set()
            for t in tasks:
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(t, self.cfg.grace_s)
            for closer in (consumer.stop, producer.stop, self.server.close):
                with contextlib.suppress(Exception):
                    await closer()
            if self._own_redis:
                with contextlib.suppress(Exception):
                    await self.redis.aclose()
            log.info("daemon.stopped", **self.stats)

    async def _start_kafka(self, client: Any, what: str) -> None:
        backoff = 0.2
        while True:
            try:
                await client.start()
                return
            except KafkaError as exc:
                self.metrics.kafka_errors.inc()
                log.warning("kafka.unreachable", client=what, error=str(exc), retry_in_s=backoff)
                if self.stop_event.is_set():
                    raise
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), backoff)
                backoff = min(backoff * 2, 10.0)

    def health(self) -> dict[str, Any]:
        """The `/healthz` document: `status` is `starting` until the daemon is ready (see the
        module docstring), then `ok` or `degraded`, and `stopping` once asked to stop."""
        kafka_ok = self.batches.kafka_ok
        degraded = self.store.degraded or not kafka_ok
        ready = (
            self.warm
            and self.assigned.is_set()
            and (not self.registry or self.models.installed.is_set())
        )
        if self.stop_event.is_set():
            status = "stopping"
        elif not ready:
            status = "starting"
        else:
            status = "degraded" if degraded else "ok"
        return {
            "status": status,
            "ready": ready,
            "warmup_s": {v: round(s, 4) for v, s in self.models.warmed.items()},
            "redis": "degraded" if self.store.degraded else "ok",
            "redis_state_age_s": round(self.store.state_age_s(), 3),
            "kafka": "ok" if kafka_ok else "reconnecting",
            "models": {arm: self.models.version(arm) for arm in ALIASES},
            "fallback": self.models.fallback.version,
            **self.stats,
        }

    def _parse_workflow(self, raw: bytes) -> Workflow:
        """A workflow as the state store keeps it (the raw `workflow` message)."""
        msg = decode(
            raw, max_bytes=self.cfg.max_message_bytes, max_depth=self.cfg.max_message_depth
        )
        if not isinstance(msg, WorkflowMsg):
            raise BadMessage(f"stored workflow is a {msg.type} message")
        return to_workflow(msg, self.cfg.max_dag_tasks)
