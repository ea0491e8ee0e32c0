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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition

from dagsched.daemon.kafka import Output, make_producer, produce_all
from dagsched.schemas.messages import (
    BadMessage,
    DecisionMsg,
    NodeDownMsg,
    NodeHeartbeatMsg,
    NodeUpMsg,
    TaskFailedMsg,
    TaskReadyMsg,
    TaskStartedMsg,
    decode,
)
from dagsched.settings import Settings
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import rng_for, stream_workflows
from dagsched.sim.state import Decision, TaskRun, TaskState
from dagsched.sim.wire import end_message, to_message
from dagsched.sim.workflow import Workflow
from dagsched.sim.workload import WorkloadGenerator

log = structlog.get_logger(__name__)

HEARTBEAT_S = 30.0  # simulated seconds between heartbeats of every node


class ReplayError(RuntimeError):
    """The closed loop cannot continue (no decision in time, broker unreachable)."""


@dataclass(frozen=True)
class WorkflowOutcome:
    """How one replayed workflow ended (`end_s` None: failed or still running)."""

    workflow_id: str
    arrival_s: float
    end_s: float | None
    met_deadline: bool
    arm: str
    version: str


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
    ) -> None:
        self.s = settings
        self.cfg = cfg
        self.progress = progress
        self.run_id = uuid.uuid4().hex[:8]
        self.rng = random.Random(cfg.seed)
        self.counts = dict.fromkeys(
            ("tasks_sent", "decisions_received", "duplicates", "dead_letters", "malformed_sent",
             "rejected", "events_sent"),
            0,
        )  # fmt: skip
        self._waiting: dict[tuple[str, int, int], asyncio.Future[DecisionMsg]] = {}
        self._answered: set[tuple[str, int, int]] = set()
        self._requests: dict[str, int] = {}
        self._placed: dict[str, tuple[int, str]] = {}  # task key -> (wire attempt, node id)
        self._started: set[tuple[str, int]] = set()
        self._queued: set[TaskRun] = set()
        self._published: dict[str, Workflow] = {}
        self._out: list[Output] = []
        self.served: dict[str, tuple[str, str]] = {}  # workflow -> (arm, version) first served
        self._done_at: dict[str, dict[int, float]] = {}  # workflow id -> task -> finish time

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
        self.served.setdefault(d.workflow_id, (d.arm, d.model_version))
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
        self.sim = sim
        self.node_ids = [f"node-{i:04d}" for i in range(sim.cluster.n)]
        self._alive = list(sim.cluster.alive)
        self._heartbeats(sim)
        next_hb = HEARTBEAT_S
        ended = 0
        while not stop.is_set():
            batch = sim.advance()
            if batch is None:
                break
            await self._pace(sim.now, wall0, stop)
            self._events(sim)
            if sim.now >= next_hb:
                self._heartbeats(sim)
                next_hb = sim.now + HEARTBEAT_S
            await self._decide(producer, sim, batch)
            self._events(sim)
            await self._flush(producer)
            done = sim.metrics.workflows_done + sim.metrics.workflows_failed
            if self.progress is not None and done != ended:
                ended = done
                self.progress(done, self.cfg.workflows or 0)
        self._events(sim)
        await self._flush(producer)
        return sim.summary()

    async def _pace(self, now: float, wall0: float, stop: asyncio.Event) -> None:
        if self.cfg.speedup <= 0:
            return
        delay = wall0 + now / self.cfg.speedup - time.monotonic()
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)

    async def _decide(self, producer: Any, sim: Simulator, batch: list[TaskRun]) -> None:
        todo = list(batch)
        while todo:
            waits = []
            for t in todo:
                wf = t.run.wf
                if wf.id not in self._published:
                    self._published[wf.id] = wf
                    self._out.append((self.s.topic("tasks"), wf.id.encode(),
                                      to_message(wf).encode()))  # fmt: skip
                attempt = self._requests.get(t.key, -1) + 1
                self._requests[t.key] = attempt
                key = (wf.id, t.idx, attempt)
                fut: asyncio.Future[DecisionMsg] = asyncio.get_running_loop().create_future()
                self._waiting[key] = fut
                waits.append(fut)
                msg = TaskReadyMsg(workflow_id=wf.id, task=t.idx, attempt=attempt, at=sim.now)
                self._out.append((self.s.topic("tasks"), wf.id.encode(), msg.encode()))
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
                node = self.node_ids.index(d.node) if d.node in self.node_ids else -1
                if node < 0 or not sim.cluster.alive[node]:
                    self.counts["rejected"] += 1  # stale view: ask again as a new attempt
                    retry.append(t)
                    continue
                sim.place(Decision(t, node, d.cpu, d.mem, d.max_retries))
                self._placed[t.key] = (d.attempt, d.node)
                if t.state == TaskState.RUNNING:
                    self._emit_started(t)
                else:
                    self._queued.add(t)
            todo = retry

    # -- events -------------------------------------------------------------------------------

    def _event(self, node: str, msg: Any) -> None:
        self._out.append((self.s.topic("events"), node.encode(), msg.encode()))
        self.counts["events_sent"] += 1

    def _emit_started(self, t: TaskRun) -> None:
        attempt, node = self._placed[t.key]
        if (t.key, attempt) in self._started:
            return
        self._started.add((t.key, attempt))
        self._event(node, TaskStartedMsg(workflow_id=t.run.wf.id, task=t.idx, attempt=attempt,
                                         node=node, at=t.start_s))  # fmt: skip

    def _events(self, sim: Simulator) -> None:
        """Publish what happened since the last call: node changes, attempt ends, starts."""
        c = sim.cluster
        for i, (was, now) in enumerate(zip(self._alive, c.alive, strict=True)):
            if was != now:
                node = self.node_ids[i]
                cls = NodeUpMsg if now else NodeDownMsg
                self._event(node, cls(node=node, at=sim.now))
                if now:
                    self._heartbeat(sim, i)
        self._alive = list(c.alive)
        assert sim.log is not None
        entries, sim.log[:] = list(sim.log), []
        for r in entries:
            wf_id, idx = r.wf_id, r.idx
            key = f"{wf_id}/{idx}"
            placed = self._placed.get(key)
            if placed is None:
                continue
            attempt, node = placed
            if (key, attempt) not in self._started:
                self._started.add((key, attempt))
                self._event(node, TaskStartedMsg(workflow_id=wf_id, task=idx, attempt=attempt,
                                                 node=node, at=r.start_s))  # fmt: skip
            if r.outcome == "done":
                self._done_at.setdefault(wf_id, {})[idx] = r.end_s
            # what a node agent measures of the attempt: the only way the truth gets out
            self._event(node, end_message(r, node, attempt))
        for t in list(self._queued):
            if t.state == TaskState.QUEUED:
                continue
            self._queued.discard(t)
            if t.state == TaskState.RUNNING:
                self._emit_started(t)
            elif t.state == TaskState.CANCELLED and t.key in self._placed:
                attempt, node = self._placed[t.key]
                self._event(node, TaskFailedMsg(workflow_id=t.run.wf.id, task=t.idx,
                                                attempt=attempt, node=node, at=sim.now,
                                                reason="cancelled"))  # fmt: skip

    def workflow_outcomes(self) -> list[WorkflowOutcome]:
        """Per workflow published so far: when it ended, whether by its deadline, who served it."""
        out = []
        for wf_id, wf in self._published.items():
            done = self._done_at.get(wf_id, {})
            end = max(done.values()) if len(done) == wf.size else None
            arm, version = self.served.get(wf_id, ("", ""))
            met = end is not None and end <= wf.arrival_s + wf.deadline_s
            out.append(WorkflowOutcome(wf_id, wf.arrival_s, end, met, arm, version))
        return out

    def _heartbeats(self, sim: Simulator) -> None:
        for i in range(sim.cluster.n):
            if sim.cluster.alive[i]:
                self._heartbeat(sim, i)

    def _heartbeat(self, sim: Simulator, i: int) -> None:
        c, info = sim.cluster, sim.cluster.nodes[i]
        self._event(
            self.node_ids[i],
            NodeHeartbeatMsg(
                node=self.node_ids[i],
                at=sim.now,
                kind=info.kind,  # type: ignore[arg-type]
                zone=info.zone,
                cores=info.cores,
                mem_gb=info.mem_gb,
                gpu_mem_gb=info.gpu_mem_gb,
                net_gbps=info.net_gbps,
                # measured use, not the reservation (sums of floats: clamp the rounding)
                used_cores=max(0.0, sim.node_use[i][0]),
                used_mem_gb=max(0.0, sim.node_use[i][1]),
                queue_len=c.queue_len[i],
                net_in_bytes=c.net_in_bytes(i, sim.now),
                failure_rate=c.failure_rate(i, sim.now),
                slowdown=c.observed_slowdown[i],
            ),
        )

    async def _flush(self, producer: Any) -> None:
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
