"""Real services for the daemon tests: one Tansu broker per session, a private redis-server,
a real MLflow store per test (copied from a session template), and per-test isolation by a
unique topic prefix (which also prefixes Redis keys and groups)."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import ConsumerRecord
from prometheus_client.parser import text_string_to_metric_families

from dagsched.daemon.broker import TansuBroker, ensure_topics
from dagsched.daemon.redis_state import RedisState
from dagsched.daemon.service import Daemon
from dagsched.registry.store import SHIPPED_CHAMPION, Registry
from dagsched.schemas.messages import (
    NodeHeartbeatMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    WorkflowMsg,
    decode,
)
from dagsched.settings import Settings, load_settings
from tests.conftest import clone_mlflow_home

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
def champion(settings: Settings, champion_template: Path) -> Registry:
    """The test's own MLflow store under `settings.home`, the shipped champion as version 1:
    a daemon started with `registry=True` serves the GNN from it."""
    clone_mlflow_home(champion_template, settings.home)
    return Registry(settings)


def register_version(reg: Registry, data: str) -> str:
    """A new version made of the shipped champion's files (no alias moves); its number."""
    parent = reg.alias_version("champion")
    with reg.run(data, {}) as run:
        return reg.register_bundle(
            SHIPPED_CHAMPION, run.run_id, metrics={}, parent=parent, data=data
        )


def stored_artifact(reg: Registry, version: str, name: str) -> Path:
    """Where the MLflow store keeps bundle file `name` of `version`."""
    source = reg.client.get_model_version(reg.name, version).source
    return Path(urlparse(source).path) / name


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


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    await writer.drain()
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


class Scrape:
    """One `GET /metrics`, parsed."""

    def __init__(self, text: str) -> None:
        self.text = text
        families = list(text_string_to_metric_families(text))
        self.names = {f.name for f in families}
        self.samples = [s for f in families for s in f.samples]

    def value(self, name: str, **labels: str) -> float:
        """The sum over samples named `name` whose labels include `labels` (0 when none, as
        for a labelled counter never incremented); a name the daemon does not export is an
        error, so a typo cannot pass as 0."""
        family = re.sub(r"_(total|count|sum|bucket|created)$", "", name)
        if name not in self.names and family not in self.names:
            raise KeyError(f"/metrics has no {name}")
        return sum(
            s.value
            for s in self.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        )


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

    @property
    def port(self) -> int:
        """The port of its `/metrics` and `/healthz` endpoint."""
        assert self.daemon.server is not None
        return self.daemon.server.port

    async def metrics(self) -> Scrape:
        status, body = await http_get(self.port, "/metrics")
        assert status == 200, status
        return Scrape(body.decode())

    async def health(self) -> dict[str, Any]:
        _, body = await http_get(self.port, "/healthz")
        doc: dict[str, Any] = json.loads(body)
        return doc

    async def serves(self, arm: str, version: str | None) -> bool:
        """Whether `/healthz` names `version` as serving `arm` (it swaps between batches)."""
        return (await self.health())["models"][arm] == version

    async def until_serving(self, arm: str, version: str | None, timeout: float = 30.0) -> None:
        await wait_for(lambda: self.serves(arm, version), timeout, f"{arm} {version} to serve")

    async def knows_nodes(self, n: int) -> bool:
        """Whether the cluster view it decides from has `n` live nodes (the updater applied
        their heartbeats)."""
        view = await self.daemon.store.view()
        return view is not None and int(view.alive.sum()) == n


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


async def committed_offsets(
    settings: Settings, topic: str = "tasks", group_suffix: str = ""
) -> dict[int, int]:
    """The daemon group's committed offset per partition of `topic` (0 when none);
    `group_suffix` names another group of the daemon's (the updater's: "-updater")."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(settings.topics.partitions)]
        offs = await admin.list_consumer_group_offsets(
            settings.topic_prefix + settings.daemon.group_id + group_suffix, partitions=tps
        )
        return {tp.partition: max(0, offs[tp].offset) if tp in offs else 0 for tp in tps}
    finally:
        await admin.close()


async def committed(settings: Settings, topic: str = "tasks") -> int:
    """Sum of the daemon group's committed offsets on `topic`."""
    return sum((await committed_offsets(settings, topic)).values())


async def read_topic(
    settings: Settings, topic: str, at_least: int = 0, timeout: float = 30.0
) -> dict[int, list[ConsumerRecord[Any, Any]]]:
    """Every record on `topic` (at least those acknowledged before the call), per partition
    in offset order; read again until there are `at_least` (records still being produced)."""
    deadline = time.monotonic() + timeout
    while True:
        got = await _read_to_end(settings, topic, deadline)
        if sum(map(len, got.values())) >= at_least:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {at_least} records on {topic}")
        await asyncio.sleep(0.05)


async def _read_to_end(
    settings: Settings, topic: str, deadline: float
) -> dict[int, list[ConsumerRecord[Any, Any]]]:
    c = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
    )
    await c.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(settings.topics.partitions)]
        c.assign(tps)
        # Tansu may report an end inside the last batch; fetches return whole batches, so
        # reading to it still returns every record acknowledged before this call
        ends = await c.end_offsets(tps)
        for tp in tps:
            c.seek(tp, 0)  # explicit: seek_to_beginning can lose a race with the default reset
        out: dict[int, list[ConsumerRecord[Any, Any]]] = defaultdict(list)
        while [tp for tp in tps if await c.position(tp) < ends[tp]]:
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out reading {topic}")
            for tp, recs in (await c.getmany(timeout_ms=100)).items():
                out[tp.partition].extend(recs)
        return dict(out)
    finally:
        await c.stop()


async def end_offsets(settings: Settings, topic: str = "tasks") -> int:
    c = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap)
    await c.start()
    try:
        tps = [TopicPartition(settings.topic(topic), p) for p in range(settings.topics.partitions)]
        ends = await c.end_offsets(tps)
        return sum(ends.values())
    finally:
        await c.stop()
