"""`dagsched sim replay`: the simulator plays the job queue and the cluster over Kafka.

This is the one adapter between the simulator (no asyncio, no Kafka) and the broker; it lives
in `daemon/` so that `sim/` stays free of both. The simulator's policy is "ask the daemon":
each batch of ready tasks is published as `task_ready` messages (after their workflow), the
replay waits for one decision per (task, attempt), places the tasks in simulated time, and
publishes what happens — task started / finished / failed, node heartbeat / down / up — to
`dagsched.events`. Simulated time advances by events; `speedup` paces it against the wall.

A decision for a node the simulator has seen die meanwhile is re-requested as a new attempt.
Wire attempts count requests per task, so a task that goes back to the queue (its node
crashed while it waited) gets a fresh decision instead of the stored one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from dagsched.core.workflow import Workflow
from dagsched.daemon.kafka import Output, make_producer, produce_all
from dagsched.schemas.messages import (
    BadMessage,
    DecisionMsg,
    decode,
)
from dagsched.settings import Settings
from dagsched.sim.engine import Simulator
from dagsched.sim.executor import SimExecutor, WorkflowOutcome
from dagsched.sim.runner import rng_for, stream_workflows
from dagsched.sim.runs import TaskRun
from dagsched.sim.workload import WorkloadGenerator

log = structlog.get_logger(__name__)

HEARTBEAT_S = 30.0  # simulated seconds between heartbeats of every node


class ReplayError(RuntimeError):
    """The closed loop cannot continue (no decision in time, broker unreachable)."""


@dataclass(frozen=True)
class ReplayConfig:
    """What to replay and how fast."""

    rate: float | None = None  # workflows per simulated second; None: from sim.workload.load
    speedup: float = 0.0  # simulated seconds per wall second; 0: as fast as decisions come
    duration_s: float | None = None  # stop arrivals after this much simulated time
    workflows: int | None = 20  # or after this many workflows
    malformed: float = 0.0  # share of extra bad messages mixed into dagsched.tasks
    seed: int = 0
    decision_timeout_s: float = 60.0


def parse_duration(text: str) -> tuple[float | None, int | None]:
    """`'600'`/`'600s'` -> (600.0, None) simulated seconds; `'50wf'` -> (None, 50) workflows."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|wf)?\s*", text)
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"expected e.g. 600, 600s or 50wf, got {text!r}")
    if m.group(2) == "wf":
        if not float(m.group(1)).is_integer():
            raise ValueError(f"a number of workflows must be whole, got {text!r}")
        return None, int(float(m.group(1)))
    return float(m.group(1)), None


def workload(settings: Settings, cfg: ReplayConfig, run_id: str) -> Iterator[Workflow]:
    """Workflows with arrivals, cut at `duration_s` or `workflows`, ids unique to this run."""
    scenario = settings.sim
    if cfg.rate is not None:
        rng = rng_for(cfg.seed, 1)
        gen = WorkloadGenerator(scenario.workload, scenario.cluster, rng, scenario.truth)

        def timed() -> Iterator[Workflow]:
            t = 0.0
            for i in itertools.count():
                t += float(rng.exponential(1.0 / cfg.rate))  # type: ignore[operator]
                yield gen.make_workflow(f"wf-{i:07d}", arrival_s=t)

        source = timed()
    else:
        source = stream_workflows(scenario, cfg.seed, cfg.workflows or 10**9)
    for i, wf in enumerate(source):
        if cfg.workflows is not None and i >= cfg.workflows:
            return
        if cfg.duration_s is not None and wf.arrival_s > cfg.duration_s:
            return
        yield replace(wf, id=f"{run_id}-{wf.id}")


def malformed_messages(rng: random.Random, run_id: str) -> bytes:
    """One deliberately bad message for `dagsched.tasks` (each kind is dead-lettered)."""
    task = {"name": "a", "type": "cpu", "duration_s": 1, "cpu_cores": 1, "mem_gb": 1}
    wf = {"schema_version": 1, "type": "workflow", "workflow_id": f"{run_id}-bad",
          "tasks": [task, task], "edges": [[0, 1]], "deadline_s": 10}  # fmt: skip
    kinds: list[Any] = [
        b"{definitely not json",
        b'["a", "list"]',
        {"schema_version": 7, "type": "task_ready", "workflow_id": "x", "task": 0},
        {"schema_version": 1, "type": "task_ready", "workflow_id": "x", "task": "zero"},
        {"schema_version": 1, "type": "task_ready", "workflow_id": f"{run_id}-nowf", "task": 0},
        {**wf, "edges": [[0, 1], [1, 0]]},
        {**wf, "tasks": [{**task, "cpu_cores": -1}]},
    ]
    kind = rng.choice(kinds)
    return kind if isinstance(kind, bytes) else json.dumps(kind).encode()


class Replay:
    """One closed-loop run; `await run(stop)` returns the metrics."""

    def __init__(
        self,
        settings: Settings,
        cfg: ReplayConfig,
        progress: Callable[[int, int], None] | None = None,
        hold: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.s = settings
        self.cfg = cfg
        self.progress = progress
        # awaited before each step of simulated time: simulated time stands still meanwhile
        self.hold = hold
        self.run_id = uuid.uuid4().hex[:8]
        self.rng = random.Random(cfg.seed)
        self.counts = dict.fromkeys(
            ("tasks_sent", "decisions_received", "duplicates", "dead_letters", "malformed_sent",
             "rejected", "events_sent"),
            0,
        )  # fmt: skip
        self._waiting: dict[tuple[str, int, int], asyncio.Future[DecisionMsg]] = {}
        self._answered: set[tuple[str, int, int]] = set()
        self._out: list[Output] = []
        self.executor: SimExecutor | None = None

    @property
    def served(self) -> dict[str, tuple[str, str]]:
        """Workflow -> (arm, version) of the decision it was first served by."""
        return self.executor.served if self.executor is not None else {}

    def workflow_outcomes(self) -> list[WorkflowOutcome]:
        """Per workflow published so far: when it ended, whether by its deadline, who served it."""
        return self.executor.workflow_outcomes() if self.executor is not None else []

    async def run(self, stop: asyncio.Event | None = None) -> dict[str, Any]:
        stop = stop or asyncio.Event()
        s = self.s
        producer = make_producer(s)
        readers = {n: self._reader() for n in ("decisions", "deadletter")}
        started = time.monotonic()
        try:
            await producer.start()
            for name, c in readers.items():
                await c.start()
                tps = [TopicPartition(s.topic(name), p) for p in range(s.topics.partitions)]
                c.assign(tps)
                await c.seek_to_end(*tps)
                for tp in tps:
                    await c.position(tp)  # resolve "end" now, before anything is published
            pumps = [
                asyncio.create_task(self._pump(readers["decisions"], self._on_decision)),
                asyncio.create_task(self._pump(readers["deadletter"], self._on_dead)),
            ]
            try:
                summary = await self._loop(producer, stop, started)
                await self._await_dead_letters()
            finally:
                for p in pumps:
                    p.cancel()
                    with contextlib.suppress(BaseException):
                        await p
        finally:
            with contextlib.suppress(Exception):
                await producer.stop()
            for c in readers.values():
                with contextlib.suppress(Exception):
                    await c.stop()
        return {
            "policy": "daemon",
            "seed": self.cfg.seed,
            **summary,
            **self.counts,
            "wall_s": time.monotonic() - started,
        }

    def _reader(self) -> AIOKafkaConsumer:
        return AIOKafkaConsumer(
            bootstrap_servers=self.s.kafka_bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=self.s.daemon.fetch_max_wait_ms,
        )

    async def _pump(self, consumer: AIOKafkaConsumer, handle: Callable[[bytes], None]) -> None:
        while True:
            got = await consumer.getmany(timeout_ms=100)
            for records in got.values():
                for r in records:
                    handle(r.value or b"")

    def _on_decision(self, raw: bytes) -> None:
        try:
            d = decode(raw)
        except BadMessage:
            return
        if not isinstance(d, DecisionMsg):
            return
        key = (d.workflow_id, d.task, d.attempt)
        if not d.workflow_id.startswith(self.run_id):
            return
        self.counts["decisions_received"] += 1
        fut = self._waiting.pop(key, None)
        if fut is not None and not fut.done():
            fut.set_result(d)
            self._answered.add(key)
        else:
            self.counts["duplicates"] += 1

    def _on_dead(self, raw: bytes) -> None:
        with contextlib.suppress(BadMessage):
            d = decode(raw)
            if d.topic == self.s.topic("tasks"):
                self.counts["dead_letters"] += 1

    async def _await_dead_letters(self) -> None:
        deadline = time.monotonic() + self.cfg.decision_timeout_s
        while self.counts["dead_letters"] < self.counts["malformed_sent"]:
            if time.monotonic() > deadline:
                log.warning("replay.dead_letters_missing", **self.counts)
                return
            await asyncio.sleep(0.02)  # the dead-letter pump runs meanwhile

    # -- the loop -----------------------------------------------------------------------------

    async def _loop(self, producer: Any, stop: asyncio.Event, wall0: float) -> dict[str, Any]:
        sim = Simulator(self.s.sim, workload(self.s, self.cfg, self.run_id), seed=self.cfg.seed,
                        keep_log=True)  # fmt: skip
        ex = self.executor = SimExecutor(sim)
        ex.heartbeats()
        next_hb = HEARTBEAT_S
        ended = 0
        while not stop.is_set():
            if self.hold is not None:
                await self.hold()
            batch = sim.advance()
            if batch is None:
                break
            await self._pace(sim.now, wall0, stop)
            ex.events()
            if sim.now >= next_hb:
                ex.heartbeats()
                next_hb = sim.now + HEARTBEAT_S
            await self._decide(producer, ex, batch)
            ex.events()
            await self._flush(producer)
            done = sim.metrics.workflows_done + sim.metrics.workflows_failed
            if self.progress is not None and done != ended:
                ended = done
                self.progress(done, self.cfg.workflows or 0)
        ex.events()
        await self._flush(producer)
        return sim.summary()

    async def _pace(self, now: float, wall0: float, stop: asyncio.Event) -> None:
        if self.cfg.speedup <= 0:
            return
        delay = wall0 + now / self.cfg.speedup - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _decide(self, producer: Any, ex: SimExecutor, batch: list[TaskRun]) -> None:
        todo = list(batch)
        while todo:
            waits = []
            for t in todo:
                msg = ex.request(t)
                key = (msg.workflow_id, msg.task, msg.attempt)
                fut: asyncio.Future[DecisionMsg] = asyncio.get_running_loop().create_future()
                self._waiting[key] = fut
                waits.append(fut)
                self.counts["tasks_sent"] += 1
                if self.cfg.malformed > 0 and self.rng.random() < self.cfg.malformed:
                    bad = malformed_messages(self.rng, self.run_id)
                    self._out.append((self.s.topic("tasks"), b"malformed", bad))
                    self.counts["malformed_sent"] += 1
            await self._flush(producer)
            try:
                async with asyncio.timeout(self.cfg.decision_timeout_s):
                    decisions = await asyncio.gather(*waits)
            except TimeoutError:
                missing = sum(1 for f in waits if not f.done())
                raise ReplayError(
                    f"{missing} decision(s) did not arrive within {self.cfg.decision_timeout_s:g} s"
                    " — is `dagsched daemon` running against this broker and topic prefix?"
                ) from None
            retry = []
            for t, d in zip(todo, decisions, strict=True):
                if not ex.apply(t, d):
                    self.counts["rejected"] += 1  # stale view: ask again as a new attempt
                    retry.append(t)
            todo = retry

    async def _flush(self, producer: Any) -> None:
        if self.executor is not None:
            for stream, key, msg in self.executor.outbox:
                self._out.append((self.s.topic(stream), key.encode(), msg.encode()))
                if stream == "events":
                    self.counts["events_sent"] += 1
            self.executor.outbox.clear()
        if not self._out:
            return
        out, self._out = self._out, []
        if not await produce_all(producer, out, time.monotonic() + self.cfg.decision_timeout_s):
            raise ReplayError("the broker did not acknowledge the replay's messages")


async def replay(
    settings: Settings,
    cfg: ReplayConfig,
    *,
    stop: asyncio.Event | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run one closed-loop replay against the daemon(s) serving `settings`' topics."""
    return await Replay(settings, cfg, progress).run(stop)
