"""The scheduling daemon: `dagsched.tasks` in, decisions (or dead letters) out, offsets after.

Lifecycle (after arq's worker): clients are built once in `async_run`, a stop event ends the
loop, the batch in flight drains within `daemon.grace_s`, and `close` always runs. `run()` is
for production (SIGTERM / SIGINT set the stop event); tests drive `async_run()` and `stop()`.

One batch: fetch up to `batch_max` records (waiting at most `batch_wait_ms` after the first),
decode each (bad ones become dead letters with their reason), store workflows, answer each
task from the decision store if it was decided before, place the rest (`placing.Placer`)
(reserving atomically in Redis), produce every output, wait for all acks, and only then commit
`{partition: last offset + 1}`. A crash anywhere before the commit redelivers the batch, and the
decision store turns the redelivery into the same decisions again: effectively once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections import defaultdict
from typing import Any

import redis.asyncio as aioredis
import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from redis.exceptions import RedisError

from dagsched.daemon.kafka import Output, make_consumer, make_producer, produce_all
from dagsched.daemon.metrics import DaemonMetrics, MetricsServer
from dagsched.daemon.models import Loader, Models, VersionOf
from dagsched.daemon.placing import Hold, Placer
from dagsched.daemon.redis_state import RedisState, connect
from dagsched.daemon.state import StateStore
from dagsched.daemon.updater import Updater
from dagsched.registry import serving
from dagsched.schemas.messages import (
    BadMessage,
    DeadLetterMsg,
    TaskReadyMsg,
    WorkflowMsg,
    decode,
)
from dagsched.schemas.topics import ALLOWED_TYPES
from dagsched.settings import Settings
from dagsched.sim.wire import to_workflow
from dagsched.sim.workflow import Workflow, WorkflowError

log = structlog.get_logger(__name__)

HOLD_S = (0.05, 0.5)  # backoff while no node is alive to place on


class _Listener(ConsumerRebalanceListener):
    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon

    async def on_partitions_revoked(self, revoked: Any) -> None:
        # let the batch in flight finish and commit before the partitions move
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.daemon.settings.daemon.grace_s):
                async with self.daemon.batch_lock:
                    pass
        log.info("partitions.revoked", partitions=sorted(str(tp) for tp in revoked))

    async def on_partitions_assigned(self, assigned: Any) -> None:
        log.info("partitions.assigned", partitions=sorted(str(tp) for tp in assigned))
        self.daemon.assigned.set()


class Daemon:
    """One replica. Several in one consumer group share the partitions of `dagsched.tasks`."""

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
    ) -> None:
        self.settings = settings
        self.cfg = settings.daemon
        self.metrics = DaemonMetrics()
        self.metrics.refresh = self._gauges
        self.registry = registry
        self.models = Models(
            settings,
            self.metrics,
            loader=loader or serving.load_alias,
            version_of=version_of or serving.alias_version,
        )
        self._own_redis = redis is None
        self.redis = redis if redis is not None else connect(settings.redis_url)
        self.rs = RedisState(self.redis, settings)
        self.store = StateStore(self.rs, self._parse_workflow)
        self.metrics_port = self.cfg.metrics_port if metrics_port is None else metrics_port
        self.run_updater = run_updater
        self.consumer_options = consumer_options or {}
        self.stop_event = asyncio.Event()
        self.assigned = asyncio.Event()  # set once partitions are assigned (tests await it)
        self.batch_lock = asyncio.Lock()
        self.server: MetricsServer | None = None
        self.consumer: Any = None
        self.updater: Updater | None = None
        self.stats: dict[str, int] = defaultdict(int)
        self.placer = Placer(settings, self.store, self.models, self.metrics, self.stats)
        self._stop_at: float | None = None
        self._kafka_ok = True

    # -- lifecycle ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the daemon to drain and exit (what SIGTERM does)."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
            log.info("daemon.stopping", grace_s=self.cfg.grace_s)
        self.stop_event.set()

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then drain and exit (production entry point)."""

        async def main() -> None:
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self.stop)
            await self.async_run()

        asyncio.run(main())

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
            if self.registry:
                tasks.append(asyncio.create_task(self.models.watch(self.stop_event, self.redis)))
                # serve the champion from the first batch when the registry answers in time;
                # otherwise start on the fallback and swap when the load completes
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.models.first_check.wait(), self.cfg.grace_s)
                self.models.swap()
            if self.run_updater:
                self.updater = Updater(
                    s, self.rs, producer, self.metrics, consumer_options=self.consumer_options
                )
                tasks.append(asyncio.create_task(self.updater.run(self.stop_event)))
            log.info("daemon.started", group=s.topic_prefix + self.cfg.group_id)
            await self._loop(consumer, producer)
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
        """The `/healthz` document."""
        degraded = self.store.degraded or not self._kafka_ok
        status = "stopping" if self.stop_event.is_set() else "degraded" if degraded else "ok"
        return {
            "status": status,
            "redis": "degraded" if self.store.degraded else "ok",
            "redis_state_age_s": round(self.store.state_age_s(), 3),
            "kafka": "ok" if self._kafka_ok else "reconnecting",
            "models": {arm: self.models.version(arm) for arm in ("champion", "challenger")},
            "fallback": self.models.fallback.version,
            **self.stats,
        }

    # -- the batch loop -----------------------------------------------------------------------

    async def _loop(self, consumer: Any, producer: Any) -> None:
        next_lag = 0.0
        while not self.stop_event.is_set():
            try:
                records = await self._fetch(consumer)
                self._kafka_ok = True
            except KafkaError as exc:
                self._kafka_ok = False
                self.metrics.kafka_errors.inc()
                log.warning("kafka.fetch_failed", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), 1.0)
                continue
            self.models.swap()  # between batches, never inside one
            self._gauges()
            if time.monotonic() > next_lag:
                next_lag = time.monotonic() + 1.0
                await self._update_lag(consumer)
            if not records:
                await self.store.maybe_resync()
                continue
            async with self.batch_lock:
                await self._handle_batch(consumer, producer, records)

    async def _fetch(self, consumer: Any) -> list[ConsumerRecord[bytes, bytes]]:
        """Up to `batch_max` records, waiting `batch_wait_ms` at most after the first."""
        limit = self.cfg.batch_max
        got = await consumer.getmany(timeout_ms=100, max_records=limit)
        records = [r for rs in got.values() for r in rs]
        if not records:
            return []
        deadline = time.monotonic() + self.cfg.batch_wait_ms / 1000
        while len(records) < limit and (left := deadline - time.monotonic()) > 0:
            more = await consumer.getmany(
                timeout_ms=max(1, int(left * 1000)), max_records=limit - len(records)
            )
            records.extend(r for rs in more.values() for r in rs)
        return records

    async def _handle_batch(
        self, consumer: Any, producer: Any, records: list[ConsumerRecord[bytes, bytes]]
    ) -> None:
        fetched = time.monotonic()
        self.metrics.batch_size.observe(len(records))
        hold = HOLD_S[0]
        while True:
            try:
                outputs, fresh = await self.process(records, fetched)
                break
            except Hold as why:
                if self.stop_event.is_set():
                    log.warning("batch.abandoned", reason=str(why), records=len(records))
                    return  # not committed: redelivered after a restart or rebalance
                log.info("batch.held", reason=str(why), retry_in_s=hold)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), hold)
                hold = min(hold * 2, HOLD_S[1])
        give_up = None if self._stop_at is None else self._stop_at + self.cfg.grace_s
        ok = await produce_all(producer, outputs, give_up, self.metrics.kafka_errors.inc)
        if not ok:
            log.warning("batch.not_acked", records=len(records))
            return
        acked = time.monotonic()
        for _ in range(fresh):
            self.metrics.latency.observe(acked - fetched)
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        try:
            await consumer.commit(offsets)
        except KafkaError as exc:  # rebalanced away: the new owner answers from the store
            self.metrics.kafka_errors.inc()
            log.warning("kafka.commit_failed", error=str(exc))
            return
        self.stats["committed"] += len(records)

    # -- one batch, pure of Kafka -------------------------------------------------------------

    async def process(
        self, records: list[ConsumerRecord[bytes, bytes]], fetched: float
    ) -> tuple[list[Output], int]:
        """The outputs for `records` (one per record) and how many were new decisions."""
        s = self.settings
        out: dict[int, Output] = {}
        workflows: list[tuple[str, Workflow, bytes]] = []
        ready: list[tuple[int, ConsumerRecord[bytes, bytes], TaskReadyMsg]] = []
        for i, rec in enumerate(records):
            try:
                msg = decode(rec.value)
                if msg.type not in ALLOWED_TYPES["tasks"]:
                    raise BadMessage(f"a {msg.type} message does not belong on {rec.topic}")
                if isinstance(msg, WorkflowMsg):
                    wf = to_workflow(msg, self.cfg.max_dag_tasks)
                    workflows.append((wf.id, wf, rec.value or b""))
                    out[i] = self._ack(rec)
                else:
                    ready.append((i, rec, msg))
            except (BadMessage, WorkflowError) as exc:
                out[i] = self._dead(
                    rec, str(exc), "invalid" if isinstance(exc, BadMessage) else "dag"
                )
        await self.store.put_workflows(workflows)
        keys = list(dict.fromkeys((f"{m.workflow_id}/{m.task}", m.attempt) for _, _, m in ready))
        answers: dict[tuple[str, int], bytes | str | None] = dict(
            zip(keys, await self.store.stored(keys), strict=True)
        )
        todo: dict[tuple[str, int], TaskReadyMsg] = {}
        for _, _, m in ready:
            key = (f"{m.workflow_id}/{m.task}", m.attempt)
            if answers.get(key) is None:
                todo.setdefault(key, m)
        new: set[tuple[str, int]] = set()
        made: list[tuple[tuple[str, int], bytes]] = []
        if todo:
            decided, new, made = await self.placer.decide(todo, fetched)
            answers.update(decided)
        logs = [(k[0], k[1], raw) for k, raw in made if k in new]
        try:
            await self.rs.put_decision_logs(logs)
        except RedisError as exc:  # explainability is best effort; decisions are not
            log.warning("decision_log.redis_failed", error=str(exc))
        fresh = 0
        seen: set[tuple[str, int]] = set()
        for i, rec, m in ready:
            key = (f"{m.workflow_id}/{m.task}", m.attempt)
            answer = answers.get(key)
            if isinstance(answer, str):  # a reason: unknown workflow or task
                out[i] = self._dead(rec, answer, "unknown")
                continue
            assert answer is not None
            if key in new and key not in seen:
                fresh += 1
            else:
                self.metrics.duplicates.inc()
                self.stats["duplicates"] += 1
            seen.add(key)
            out[i] = (s.topic("decisions"), m.workflow_id.encode(), answer)
        outputs = [out[i] for i in range(len(records)) if out[i][2]]
        topic = s.topic("decisionlog")
        outputs += [(topic, k.split("/")[0].encode(), raw) for k, _, raw in logs]
        return outputs, fresh

    def _ack(self, rec: ConsumerRecord[bytes, bytes]) -> Output:
        del rec
        return ("", None, b"")  # nothing to produce; the record is answered by storing it

    def _dead(self, rec: ConsumerRecord[bytes, bytes], reason: str, kind: str) -> Output:
        self.metrics.dead_letters.labels(kind=kind).inc()
        self.stats["dead_letters"] += 1
        log.warning(
            "input.dead_letter",
            topic=rec.topic,
            partition=rec.partition,
            offset=rec.offset,
            reason=reason,
        )
        msg = DeadLetterMsg.of(
            rec.value, rec.key, rec.topic, rec.partition, rec.offset, reason, time.time()
        )
        return (self.settings.topic("deadletter"), rec.key, msg.encode())

    def _parse_workflow(self, raw: bytes) -> Workflow:
        msg = decode(raw)
        if not isinstance(msg, WorkflowMsg):
            raise BadMessage(f"stored workflow is a {msg.type} message")
        return to_workflow(msg, self.cfg.max_dag_tasks)

    # -- metrics ------------------------------------------------------------------------------

    def _gauges(self) -> None:
        self.metrics.redis_up.set(0 if self.store.degraded else 1)
        self.metrics.redis_age.set(self.store.state_age_s())

    async def _update_lag(self, consumer: Any) -> None:
        lag = 0
        try:
            for tp in consumer.assignment():
                high = consumer.highwater(tp)
                if high is not None:
                    lag += max(0, high - await consumer.position(tp))
        except Exception:  # partitions moving: try again next time
            return
        self.metrics.consumer_lag.set(lag)
