"""The daemon's batch loop: consume `dagsched.tasks`, decide, produce, then commit.

One batch: fetch up to `batch_max` records (waiting at most `batch_wait_ms` after the first),
decode each (bad ones become dead letters with their reason), store workflows, answer each
task from the decision store if it was decided before, place the rest (`placing.Placer`)
(reserving atomically in Redis), produce every output, wait for all acks, and only then commit
`{partition: last offset + 1}`. A crash anywhere before the commit redelivers the batch, and the
decision store turns the redelivery into the same decisions again: effectively once.

`BatchLoop.process` is one batch pure of Kafka; `run` is the loop around it. The lifecycle
(clients, signals, draining) is `dagsched.daemon.service.Daemon`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from typing import Any

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from aiokafka.structs import ConsumerRecord
from redis.exceptions import RedisError

from dagsched.core.wire import to_workflow
from dagsched.core.workflow import Workflow, WorkflowError
from dagsched.daemon.arms import Models
from dagsched.daemon.call_log import Logged
from dagsched.daemon.kafka import Output, dead_letter, produce_all
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.placing import Hold, Placer
from dagsched.daemon.redis_state import RedisState
from dagsched.daemon.replication import ReplicaWait
from dagsched.daemon.state_store import StateStore
from dagsched.schemas.messages import (
    MAX_MESSAGE_BYTES,
    MAX_MESSAGE_DEPTH,
    BadMessage,
    TaskReadyMsg,
    WorkflowMsg,
    decode_fast,
)
from dagsched.schemas.topics import ALLOWED_TYPES
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

HOLD_S = (0.05, 0.5)  # backoff while no node is alive to place on
IDLE_S = 0.001  # a first fetch that waited longer found the loop idle: no batch wait then
# how `TaskReadyMsg.encode` and `WorkflowMsg.encode` start a message: such a record is
# validated as that type straight away (what `decode` ends with), skipping its json.loads
# pass, which is there to name what is wrong with a message; any failure goes through
# `decode` for that reason
FAST_TYPES: tuple[tuple[bytes, type[TaskReadyMsg] | type[WorkflowMsg]], ...] = (
    (b'{"schema_version":1,"type":"task_ready",', TaskReadyMsg),
    (b'{"schema_version":1,"type":"workflow",', WorkflowMsg),
)


def decode_record(
    raw: bytes | None, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_MESSAGE_DEPTH
) -> Any:
    """`decode` within the limits, with the fast path for a well-formed `task_ready` or
    `workflow`."""
    return decode_fast(raw, FAST_TYPES, max_bytes, max_depth)


async def _behind(consumer: Any) -> bool:
    """Whether the broker held records for this consumer past what it has handed out, as of
    the last fetch responses (their high watermarks)."""
    try:
        for tp in consumer.assignment():
            high = consumer.highwater(tp)
            if high is not None and high > await consumer.position(tp):
                return True
    except Exception:  # partitions moving: take what is here
        return False
    return False


class BatchLoop:
    """Batches of one replica: fetch, decide (or answer from the store), produce, commit.

    `stop_event` ends the loop; `stop_at` (monotonic, set by the daemon when it is asked to
    stop) bounds how long a batch in flight may still wait for its acks. `batch_lock` is held
    while a batch is handled, so a rebalance can wait for it to commit."""

    # decisions go out only once this many Redis replicas hold them (redis_wait_replicas)
    fence: ReplicaWait | None = None

    def __init__(
        self,
        settings: Settings,
        rs: RedisState,
        store: StateStore,
        models: Models,
        metrics: DaemonMetrics,
        stats: dict[str, int],
        stop_event: asyncio.Event,
    ) -> None:
        self.settings = settings
        self.cfg = settings.daemon
        self.rs = rs
        self.store = store
        self.models = models
        self.metrics = metrics
        self.stats = stats
        self.stop_event = stop_event
        self.placer = Placer(settings, store, models, metrics, stats)
        if settings.redis_wait_replicas:
            self.fence = ReplicaWait(rs.redis, settings, stats)
        self.batch_lock = asyncio.Lock()
        self._in_flight: asyncio.Task[None] | None = None  # the batch being acked, committed
        # freeze what lives long (modules, torch, the model) out of the collector's sight: a
        # full collection walked all of it, 180-300 ms in the middle of a batch
        self.freeze_gc = False
        self.stop_at: float | None = None
        self.kafka_ok = True

    async def run(self, consumer: Any, producer: Any) -> None:
        """Handle batches until the stop event; models swap between batches only. The batch
        before is acked and committed (`_finish`) while this one is decided."""
        next_lag = 0.0
        try:
            while not self.stop_event.is_set():
                try:
                    records = await self._fetch(consumer)
                    self.kafka_ok = True
                except KafkaError as exc:
                    self.kafka_ok = False
                    self.metrics.kafka_errors.inc()
                    log.warning("kafka.fetch_failed", error=str(exc))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.stop_event.wait(), 1.0)
                    continue
                if self.models.swap() and self.freeze_gc:  # between batches, never inside one
                    gc.freeze()
                self.gauges()
                if time.monotonic() > next_lag:
                    next_lag = time.monotonic() + 1.0
                    await self._update_lag(consumer)
                if not records:
                    await self.drain()  # nothing new: let the batch before commit first
                # between any two batches: a loop under steady load is never idle, and its
                # decisions stay in memory only until Redis has them back
                await self.store.maybe_resync()
                if not records:
                    continue
                async with self.batch_lock:
                    await self._handle_batch(consumer, producer, records)
        finally:
            await self.drain()
            # decisions made while Redis was away: a last try to store them before exiting
            with contextlib.suppress(Exception):
                await self.store.maybe_resync(now=True)

    async def drain(self) -> None:
        """Wait until the batch in flight (if any) is acked and committed (or given up); a
        waiter that is cancelled (a rebalance's timeout) leaves it running."""
        if self._in_flight is not None:
            await asyncio.shield(self._in_flight)

    async def _fetch(self, consumer: Any) -> list[ConsumerRecord[bytes, bytes]]:
        """Up to `batch_max` records, waiting `batch_wait_ms` at most after the first for more
        only while input is queued: when records were already waiting for this loop (it is
        busy: a fetch holds one response per partition, so more has likely arrived behind
        them), or the broker's high watermark says it holds records not fetched yet. A task
        that finds the loop idle is decided at once: waiting for input that is not there only
        added latency."""
        limit = self.cfg.batch_max
        asked = time.monotonic()
        got = await consumer.getmany(timeout_ms=100, max_records=limit)
        records = [r for rs in got.values() for r in rs]
        if not records:
            return []
        now = time.monotonic()
        # busy: several records were waiting when the loop asked. A lone one found at once
        # only means aiokafka's fetcher took it while the loop was between calls: an idle
        # topic's task, which must not wait `batch_wait_ms` for input that is not there
        busy = now - asked < IDLE_S and len(records) > 1
        deadline = now + self.cfg.batch_wait_ms / 1000
        while len(records) < limit:
            more = await consumer.getmany(timeout_ms=0, max_records=limit - len(records))
            if not more:  # nothing buffered: wait for a fetch only while input is queued
                left = deadline - time.monotonic()
                if left <= 0 or not (busy or await _behind(consumer)):
                    break
                more = await consumer.getmany(
                    timeout_ms=max(1, int(left * 1000)), max_records=limit - len(records)
                )
                if not more:
                    break
            records.extend(r for rs in more.values() for r in rs)
        return records

    async def _handle_batch(
        self, consumer: Any, producer: Any, records: list[ConsumerRecord[bytes, bytes]]
    ) -> None:
        """Decide the batch, then hand its outputs to `_finish` in a task of their own once
        the batch before is finished (commits stay in order, one batch in flight)."""
        fetched = time.monotonic()
        self.metrics.batch_size.observe(len(records))
        hold = HOLD_S[0]
        while True:
            try:
                outputs, fresh, logs = await self.process(records, fetched)
                break
            except Hold as why:
                if self.stop_event.is_set():
                    log.warning("batch.abandoned", reason=str(why), records=len(records))
                    return  # not committed: redelivered after a restart or rebalance
                log.info("batch.held", reason=str(why), retry_in_s=hold)
                self.metrics.held.inc()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), hold)
                hold = min(hold * 2, HOLD_S[1])
        await self.drain()
        self._in_flight = asyncio.create_task(
            self._finish(consumer, producer, records, outputs, logs, fresh, fetched)
        )

    async def _finish(
        self,
        consumer: Any,
        producer: Any,
        records: list[ConsumerRecord[bytes, bytes]],
        outputs: list[Output],
        logs: list[Logged],
        fresh: int,
        fetched: float,
    ) -> None:
        """Produce the batch's outputs while its decision logs are kept in Redis, wait for
        every ack and the logs, then commit `{partition: last offset + 1}`. With
        `redis_wait_replicas`, the batch first waits for that many Redis replicas to hold
        what it wrote, decisions and workflows (`ReplicaWait`).

        The decisions are stored (`decide_many`) before this runs: that is what makes a
        redelivery answer the same. The Redis decision log is best effort, for `explain`,
        so the outputs need not wait for it: writing it first kept every decision a Redis
        round trip (and the log's compression) longer from its reader. The commit still
        waits for both, so a committed batch has its logs kept."""
        give_up = None if self.stop_at is None else self.stop_at + self.cfg.grace_s
        if self.fence is not None and not self.store.degraded:  # its workflows too
            await self.fence()
        produced = produce_all(producer, outputs, give_up, self.metrics.kafka_errors.inc)
        if logs and not self.store.degraded:
            ok, _ = await asyncio.gather(produced, self._keep_logs(logs))
        else:
            ok = await produced
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

    async def _keep_logs(self, logs: list[Logged]) -> None:
        try:  # one script call for the batch's logs, trimmed to the cap
            await self.rs.put_decision_logs(logs)
        except RedisError as exc:  # explainability is best effort; decisions are not
            log.warning("decision_log.redis_failed", error=str(exc))

    # -- one batch, pure of Kafka -------------------------------------------------------------

    async def process(
        self, records: list[ConsumerRecord[bytes, bytes]], fetched: float
    ) -> tuple[list[Output], int, list[Logged]]:
        """The outputs for `records` (one per record), how many were new decisions, and the
        decision-log records to keep in Redis."""
        s = self.settings
        out: dict[int, Output] = {}
        workflows: list[tuple[str, Workflow, bytes]] = []
        ready: list[tuple[int, ConsumerRecord[bytes, bytes], TaskReadyMsg]] = []
        # counted and logged once the batch is decided: a held batch is processed again
        dead: list[tuple[ConsumerRecord[bytes, bytes], str, str]] = []
        for i, rec in enumerate(records):
            try:
                msg = decode_record(
                    rec.value, self.cfg.max_message_bytes, self.cfg.max_message_depth
                )
                if msg.type not in ALLOWED_TYPES["tasks"]:
                    raise BadMessage(f"a {msg.type} message does not belong on {rec.topic}")
                if isinstance(msg, WorkflowMsg):
                    wf = to_workflow(msg, self.cfg.max_dag_tasks)
                    workflows.append((wf.id, wf, rec.value or b""))
                    out[i] = self._ack(rec)
                else:
                    ready.append((i, rec, msg))
            except (BadMessage, WorkflowError) as exc:
                kind = "invalid" if isinstance(exc, BadMessage) else "dag"
                out[i] = self._dead(dead, rec, str(exc), kind)
            except (RecursionError, MemoryError) as exc:  # no one record stops the loop
                reason = f"message too complex to handle ({type(exc).__name__})"
                out[i] = self._dead(dead, rec, reason, "invalid")
        await self.store.put_workflows(workflows)
        keys = list(dict.fromkeys((f"{m.workflow_id}/{m.task}", m.attempt) for _, _, m in ready))
        inputs = None
        if ready:  # the stored decisions and the first round's reads, both round trips at once
            stored, inputs = await asyncio.gather(
                self.store.stored(keys), self.placer.read_inputs(m for _, _, m in ready)
            )
        else:
            stored = []
        answers: dict[tuple[str, int], bytes | str | None] = dict(zip(keys, stored, strict=True))
        todo: dict[tuple[str, int], TaskReadyMsg] = {}
        for _, _, m in ready:
            key = (f"{m.workflow_id}/{m.task}", m.attempt)
            if answers.get(key) is None:
                todo.setdefault(key, m)
        new: set[tuple[str, int]] = set()
        logs: list[Logged] = []
        if todo:
            decided, new, logs = await self.placer.decide(todo, fetched, inputs)
            answers.update(decided)
        fresh = 0
        seen: set[tuple[str, int]] = set()
        for i, rec, m in ready:
            key = (f"{m.workflow_id}/{m.task}", m.attempt)
            answer = answers.get(key)
            if isinstance(answer, str):  # a reason: unknown workflow or task
                out[i] = self._dead(dead, rec, answer, "unknown")
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
        outputs += [(topic, None, raw) for _, raw in logs]
        for rec, reason, kind in dead:
            self.metrics.dead_letters.labels(kind=kind).inc()
            self.stats["dead_letters"] += 1
            log.warning(
                "input.dead_letter",
                topic=rec.topic,
                partition=rec.partition,
                offset=rec.offset,
                reason=reason,
            )
        return outputs, fresh, logs

    def _ack(self, rec: ConsumerRecord[bytes, bytes]) -> Output:
        del rec
        return ("", None, b"")  # nothing to produce; the record is answered by storing it

    def _dead(
        self,
        dead: list[tuple[ConsumerRecord[bytes, bytes], str, str]],
        rec: ConsumerRecord[bytes, bytes],
        reason: str,
        kind: str,
    ) -> Output:
        dead.append((rec, reason, kind))
        return dead_letter(self.settings, rec, reason)

    # -- metrics ------------------------------------------------------------------------------

    def gauges(self) -> None:
        """Refresh the Redis gauges (also called when /metrics is scraped)."""
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
