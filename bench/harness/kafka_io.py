"""The daemon throughput bench's workload and Kafka traffic from the bench process: the default
scenario's workflows and their `task_ready` messages, the cluster as heartbeats, a
confluent-kafka producer (publish as fast as it goes, or paced), and a reader of
`dagsched.decisions` that notes when each task's first decision arrived."""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

from dagsched.settings import Settings

Key = tuple[str, int, int]


# -- workload ---------------------------------------------------------------------------------


def workload(tasks: int, tag: str, seed: int) -> tuple[list[tuple[str, bytes]], list[Any]]:
    """Workflow messages (id, bytes) and their `task_ready` messages (key, id, bytes), at least
    `tasks` of them, every task of every workflow, shuffled across workflows."""
    from dagsched.core.wire import to_message
    from dagsched.schemas.messages import TaskReadyMsg
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.runner import stream_workflows

    wfs: list[tuple[str, bytes]] = []
    ready: list[tuple[Key, str, bytes]] = []
    for wf in stream_workflows(ScenarioConfig(), seed, 1_000_000):
        wf_id = f"{tag}-{wf.id}"
        wfs.append((wf_id, to_message(wf).model_copy(update={"workflow_id": wf_id}).encode()))
        for i in range(wf.size):
            msg = TaskReadyMsg(workflow_id=wf_id, task=i, attempt=0).encode()
            ready.append(((wf_id, i, 0), wf_id, msg))
        if len(ready) >= tasks:
            break
    random.Random(seed).shuffle(ready)
    return wfs, ready


def heartbeats() -> list[Any]:
    """The default cluster's nodes as heartbeats at t=0."""
    from dagsched.schemas.messages import NodeHeartbeatMsg
    from dagsched.sim.config import ScenarioConfig

    c = ScenarioConfig().cluster
    out = []
    for g in c.groups:
        for _ in range(g.count):
            i = len(out)
            out.append(
                NodeHeartbeatMsg(
                    node=f"node-{i:04d}", at=0.0, kind=g.kind, zone=i % c.zones,  # type: ignore[arg-type]
                    cores=g.cores, mem_gb=g.mem_gb, gpu_mem_gb=g.gpu_mem_gb, net_gbps=g.net_gbps,
                )
            )  # fmt: skip
    return out


# -- Kafka from this process (confluent-kafka: C threads, so it takes little of the GIL) ------


def producer(s: Settings, linger_ms: float = 5) -> Any:
    """A confluent-kafka producer for the bench's traffic. `linger_ms`: 5 is librdkafka's
    default (1 ms sent 5x more requests for Tansu to serve); Tansu's cost per request grows
    with the batches it holds, so a long run batches more (bench/soak.py)."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": linger_ms,
            "partitioner": "murmur2_random",  # what aiokafka and Java clients use
            "queue.buffering.max.messages": 1_000_000,
        }
    )


def produce(p: Any, topic: str, key: str, value: bytes, backoff_s: float = 0.01) -> None:
    """Hand one record to a confluent-kafka producer, waiting while its queue is full."""
    while True:
        try:
            p.produce(topic, value, key.encode())
            break
        except BufferError:
            p.poll(backoff_s)
    p.poll(0)


def publish(p: Any, topic: str, items: list[tuple[str, bytes]]) -> None:
    """Produce (key, value) pairs as fast as they go, then wait for every ack."""
    for key, value in items:
        produce(p, topic, key, value)
    p.flush(60)


class Reader:
    """Reads `dagsched.decisions` from the beginning in a thread: first arrival per task."""

    def __init__(self, s: Settings) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.c = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": f"{s.topic_prefix}bench-reader",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "fetch.min.bytes": 1,
            }
        )
        topic = s.topic("decisions")
        self.c.assign([TopicPartition(topic, p, -2) for p in range(s.topics.partitions)])
        self.arrived: dict[Key, tuple[float, str]] = {}
        self.raw: dict[Key, bytes] = {}
        self.acks = 0
        self.records = 0
        self.conflicts = 0  # a task answered twice with different bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            # block until one record is there (arrival = when it came), then take what else is
            # already queued without waiting: consume(n, t) alone would wait for n or t
            first = self.c.poll(0.05)
            if first is None:
                continue
            now = time.time()
            msgs = [first, *self.c.consume(10_000, 0)]
            for m in msgs:
                if m.error():
                    continue
                value = m.value()
                self.records += 1
                d = json.loads(value)
                if d.get("type") != "decision":
                    self.acks += 1
                    continue
                k = (d["workflow_id"], d["task"], d["attempt"])
                if k in self.arrived:
                    if self.raw[k] != value:
                        self.conflicts += 1
                    continue
                self.arrived[k] = (now, d["arm"])
                self.raw[k] = value

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.c.close()


def pace(p: Any, topic: str, items: list[tuple[Key, str, bytes]], rate: float) -> dict[Key, float]:
    """Offer `items` at `rate` per second; the wall time each was handed to the producer."""
    sent: dict[Key, float] = {}
    t0 = time.perf_counter()
    for i, (k, key, value) in enumerate(items):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0.0005:
            time.sleep(delay)
        sent[k] = time.time()
        produce(p, topic, key, value, backoff_s=0.001)
    p.flush(60)
    return sent
