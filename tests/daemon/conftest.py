"""Real services for the daemon tests: one Tansu broker per session, a private redis-server,
and per-test isolation by a unique topic prefix (which also prefixes Redis keys and groups)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from dagsched.daemon.broker import TansuBroker, ensure_topics
from dagsched.daemon.redis_state import RedisState
from dagsched.daemon.service import Daemon
from dagsched.schemas.messages import (
    NodeHeartbeatMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    WorkflowMsg,
    decode,
)
from dagsched.settings import Settings, load_settings

# Tansu holds a new group member for half its session timeout: keep joins short in tests.
FAST_GROUP = {
    "session_timeout_ms": 2000,
    "heartbeat_interval_ms": 200,
    "rebalance_timeout_ms": 1000,
}


@pytest.fixture(scope="session")
def broker() -> Iterator[TansuBroker]:
    with TansuBroker() as b:
        yield b


def make_settings(bootstrap: str, redis_url: str, home: Path, **overrides: Any) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:10]}."
    base = {
        "kafka_bootstrap": bootstrap,
        "redis_url": redis_url,
        "topic_prefix": prefix,
        "home": str(home),
        "daemon.metrics_port": 0,
        "daemon.reload_poll_s": 0.5,
        "daemon.grace_s": 5.0,
    }
    base.update(overrides)
    return load_settings("test", base, environ={})


@pytest.fixture
async def settings(broker: TansuBroker, redis_url: str, tmp_path: Path) -> Settings:
    s = make_settings(broker.bootstrap, redis_url, tmp_path)
    await ensure_topics(s)
    return s


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(settings.redis_url)
    yield client
    await client.aclose()


@pytest.fixture
def rstate(redis: aioredis.Redis, settings: Settings) -> RedisState:
    return RedisState(redis, settings)


async def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `cond` (sync or async) until truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


class Client:
    """What a job queue does: produce tasks and events, read decisions and dead letters."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap, acks="all")
        self.readers: dict[str, AIOKafkaConsumer] = {}
        self.got: dict[str, list[Any]] = {"decisions": [], "deadletter": []}
        self.raw: dict[str, list[bytes]] = {"decisions": [], "deadletter": []}

    async def start(self) -> Client:
        await self.producer.start()
        for name in self.got:
            topic = self.s.topic(name)
            c = AIOKafkaConsumer(
                bootstrap_servers=self.s.kafka_bootstrap,
                enable_auto_commit=False,
                fetch_max_wait_ms=5,
                auto_offset_reset="earliest",
            )
            await c.start()
            c.assign([TopicPartition(topic, p) for p in range(self.s.topics.partitions)])
            await c.seek_to_beginning()
            self.readers[name] = c
        return self

    async def close(self) -> None:
        await self.producer.stop()
        for c in self.readers.values():
            await c.stop()

    async def send(self, topic: str, value: bytes, key: str | None = None) -> None:
        await self.producer.send_and_wait(
            self.s.topic(topic), value, key=key.encode() if key is not None else None
        )

    async def heartbeats(self, n: int = 4, cores: float = 16, mem_gb: float = 64) -> list[str]:
        ids = [f"node-{i:04d}" for i in range(n)]
        for i, node in enumerate(ids):
            hb = NodeHeartbeatMsg(
                node=node, at=0.0, kind="cpu", zone=i % 2, cores=cores, mem_gb=mem_gb
            )
            await self.send("events", hb.encode(), node)
        return ids

    async def workflow(
        self, wf_id: str, n_tasks: int = 3, cores: float = 2.0, mem_gb: float = 4.0
    ) -> WorkflowMsg:
        msg = WorkflowMsg(
            workflow_id=wf_id,
            tasks=[
                TaskSpecMsg(name=f"t{i}", type="cpu", duration_s=10, cpu_cores=cores, mem_gb=mem_gb)
                for i in range(n_tasks)
            ],
            edges=[(0, i) for i in range(1, n_tasks)],
            deadline_s=100.0,
        )
        await self.send("tasks", msg.encode(), wf_id)
        return msg

    async def ready(self, wf_id: str, task: int, attempt: int = 0) -> None:
        msg = TaskReadyMsg(workflow_id=wf_id, task=task, attempt=attempt)
        await self.send("tasks", msg.encode(), wf_id)

    async def poll(self) -> None:
        for name, c in self.readers.items():
            got = await c.getmany(timeout_ms=10)
            for recs in got.values():
                for r in recs:
                    self.raw[name].append(r.value)
                    self.got[name].append(decode(r.value))

    async def wait(self, name: str, n: int, timeout: float = 30.0) -> list[Any]:
        async def enough() -> bool:
            await self.poll()
            return len(self.got[name]) >= n

        await wait_for(enough, timeout, f"{n} {name}")
        return self.got[name]


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[Client]:
    c = await Client(settings).start()
    yield c
    await c.close()


class Running:
    """A daemon running in this event loop."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.task: asyncio.Task[None] = asyncio.create_task(daemon.async_run())

    async def ready(self, timeout: float = 30.0) -> Running:
        waiter = asyncio.create_task(self.daemon.assigned.wait())
        done, _ = await asyncio.wait(
            {waiter, self.task}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if self.task in done:
            self.task.result()
            raise AssertionError("daemon exited before it was assigned partitions")
        if waiter not in done:
            waiter.cancel()
            raise AssertionError("daemon was not assigned partitions in time")
        return self

    async def stop(self, timeout: float = 30.0) -> None:
        self.daemon.stop()
        await asyncio.wait_for(self.task, timeout)


@pytest.fixture
async def start_daemon(settings: Settings) -> AsyncIterator[Callable[..., Any]]:
    running: list[Running] = []

    async def start(s: Settings | None = None, **kw: Any) -> Running:
        kw.setdefault("consumer_options", FAST_GROUP)
        kw.setdefault("metrics_port", 0)
        kw.setdefault("registry", False)  # the heuristic serves unless a test installs a model
        r = Running(Daemon(s or settings, **kw))
        running.append(r)
        return await r.ready()

    yield start
    for r in running:
        if not r.task.done():
            await r.stop()


async def committed(settings: Settings, topic: str = "tasks") -> int:
    """Sum of the daemon group's committed offsets on `topic`."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(settings.topics.partitions)]
        offs = await admin.list_consumer_group_offsets(
            settings.topic_prefix + settings.daemon.group_id, partitions=tps
        )
        return sum(max(0, o.offset) for o in offs.values())
    finally:
        await admin.close()


async def end_offsets(settings: Settings, topic: str = "tasks") -> int:
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await c.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(settings.topics.partitions)]
        ends = await c.end_offsets(tps)
        return sum(ends.values())
    finally:
        await c.stop()
