"""The chaos bench's traffic: a steady stream of workflows and their `task_ready` messages at a
fixed rate, the cluster's heartbeats every second (so a Redis that restarts empty learns the
nodes again), and a reader of `dagsched.decisions` and `dagsched.deadletter` that keeps every
answer per task, so lost, conflicting and dead-lettered tasks can be counted.

Both run in threads with confluent-kafka (C threads: little of the GIL), each from the
beginning of its partitions and resetting to the earliest offset, so a broker that comes back
empty (Tansu keeps its log in memory) is read from its new start.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from dagsched.settings import Settings
from harness.kafka_io import heartbeats

Key = tuple[str, int, int]


def task_stream(tag: str, seed: int) -> Iterator[tuple[str, bytes, Key | None]]:
    """(workflow id, message, task key or None for the workflow itself): each workflow of the
    default scenario, then every one of its tasks as ready (no `at`: no batch waits for the
    updater)."""
    from dagsched.core.wire import to_message
    from dagsched.schemas.messages import TaskReadyMsg
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.runner import stream_workflows

    for wf in stream_workflows(ScenarioConfig(), seed, 10_000_000):
        wf_id = f"{tag}-{wf.id}"
        yield wf_id, to_message(wf).model_copy(update={"workflow_id": wf_id}).encode(), None
        for i in range(wf.size):
            msg = TaskReadyMsg(workflow_id=wf_id, task=i, attempt=0).encode()
            yield wf_id, msg, (wf_id, i, 0)


@dataclass
class Sent:
    """What the producer did with each task: when it was handed over, in which phase, and
    whether the broker acknowledged it (None: not yet; False: delivery failed)."""

    at: dict[Key, float] = field(default_factory=dict)
    phase: dict[Key, str] = field(default_factory=dict)
    acked: dict[Key, bool] = field(default_factory=dict)
    acked_at: dict[Key, float] = field(default_factory=dict)


class Load:
    """Offers `rate` tasks/s until `stop()`; `phase` labels the tasks sent from now on."""

    def __init__(self, s: Settings, rate: float, tag: str = "c", seed: int = 7) -> None:
        from confluent_kafka import Producer

        self.s = s
        self.rate = rate
        self.phase = "warmup"
        self.sent = Sent()
        self.errors = 0
        self.p = Producer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 5,
                "partitioner": "murmur2_random",
                "queue.buffering.max.messages": 2_000_000,
                "message.timeout.ms": 120_000,  # a broker outage: deliver when it is back
                "reconnect.backoff.max.ms": 500,
                "log_level": 2,  # a broker away is the point: no connection errors on stderr
            }
        )
        self._stream = task_stream(tag, seed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._hb = heartbeats()

    def start(self) -> Load:
        """Start the producer thread."""
        self._thread.start()
        return self

    def _report(self, key: Key) -> Any:
        def done(err: Any, _msg: Any) -> None:
            self.sent.acked[key] = err is None
            if err is None:
                self.sent.acked_at[key] = time.time()
            else:
                self.errors += 1

        return done

    def _produce(self, topic: str, key: str, value: bytes, cb: Any = None) -> None:
        while not self._stop.is_set():
            try:
                self.p.produce(topic, value, key.encode(), on_delivery=cb)
                return
            except BufferError:
                self.p.poll(0.01)

    def _run(self) -> None:
        tasks, events = self.s.topic("tasks"), self.s.topic("events")
        t0 = time.perf_counter()
        n = 0
        next_hb = 0.0
        while not self._stop.is_set():
            now = time.perf_counter()
            if now >= next_hb:  # the executor's heartbeats, as a job queue would send them
                for hb in self._hb:
                    msg = hb.model_copy(update={"at": now - t0}).encode()
                    self._produce(events, hb.node, msg)
                next_hb = now + 1.0
            wf_id, value, key = next(self._stream)
            if key is not None:
                delay = t0 + n / self.rate - time.perf_counter()
                if delay > 0.0005:
                    time.sleep(delay)
                n += 1
                self.sent.at[key] = time.time()
                self.sent.phase[key] = self.phase
                self._produce(tasks, wf_id, value, self._report(key))
            else:
                self._produce(tasks, wf_id, value)
            self.p.poll(0)

    def stop(self) -> None:
        """Stop offering; wait (a while) for the acks of what was sent."""
        self._stop.set()
        self._thread.join(10)
        self.p.flush(30)


class Answers:
    """Every decision and dead letter per task, read in a thread from the topics' start."""

    def __init__(self, s: Settings) -> None:
        from confluent_kafka import Consumer

        self.s = s
        self.c = Consumer(
            {
                "bootstrap.servers": s.kafka_bootstrap,
                "group.id": f"{s.topic_prefix}chaos-reader",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",  # an empty broker after a restart
                "fetch.wait.max.ms": 5,
                "topic.metadata.refresh.interval.ms": 1000,
                "log_level": 2,
            }
        )
        self.decisions: dict[Key, list[tuple[float, bytes]]] = {}
        self.dead: dict[Key, list[str]] = {}
        self._stop = threading.Event()
        self._assign()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _assign(self) -> None:
        from confluent_kafka import TopicPartition

        topics = [self.s.topic("decisions"), self.s.topic("deadletter")]
        parts = range(self.s.topics.partitions)
        self.c.assign([TopicPartition(t, p, -2) for t in topics for p in parts])

    def reassign(self) -> None:
        """Read the topics from their (new) beginning: the broker came back empty."""
        self._reassign = True

    _reassign = False

    def _run(self) -> None:
        dec_topic = self.s.topic("decisions")
        while not self._stop.is_set():
            if self._reassign:
                self._reassign = False
                self._assign()
            first = self.c.poll(0.05)
            if first is None:
                continue
            now = time.time()
            for m in [first, *self.c.consume(10_000, 0)]:
                if m.error():
                    continue
                value = m.value()
                try:
                    d = json.loads(value)
                except ValueError:
                    continue
                if m.topic() == dec_topic:
                    if d.get("type") != "decision":
                        continue
                    k = (d["workflow_id"], d["task"], d["attempt"])
                    self.decisions.setdefault(k, []).append((now, value))
                else:
                    k = _dead_key(d)
                    if k is not None:
                        self.dead.setdefault(k, []).append(d.get("reason", ""))

    def close(self) -> None:
        """Stop reading."""
        self._stop.set()
        self._thread.join(5)
        self.c.close()


def _dead_key(d: dict[str, Any]) -> Key | None:
    try:
        original = json.loads(base64.b64decode(d["original_b64"]))
        return (original["workflow_id"], original["task"], original.get("attempt", 0))
    except (KeyError, ValueError, TypeError):
        return None
