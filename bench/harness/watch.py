"""Read `dagsched.tasks` and `dagsched.decisions` from the beginning: what was asked, what was
decided, by which version, on which partition."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from dagsched.settings import Settings


@dataclass
class Decision:
    """One record on `dagsched.decisions`, as the watch read it."""

    raw: bytes
    partition: int
    version: str
    arm: str
    decided_at: float


class Watch:
    """Reads `tasks` (to know what was asked) and `decisions` from the start."""

    def __init__(self, settings: Settings) -> None:
        self.s = settings
        self.asked: set[tuple[str, int, int]] = set()
        self.ready_msgs = 0
        self.wf_partition: dict[str, int] = {}
        self.decisions: dict[tuple[str, int, int], list[Decision]] = defaultdict(list)
        self.records = 0
        self.undecodable = 0
        self.consumer: Any = None

    async def start(self) -> None:
        """Assign every partition of both topics and seek to their beginnings."""
        from aiokafka import AIOKafkaConsumer, TopicPartition

        c = AIOKafkaConsumer(
            bootstrap_servers=self.s.kafka_bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=5,
            auto_offset_reset="earliest",
        )
        await c.start()
        parts = range(self.s.topics.partitions)
        tps = [TopicPartition(self.s.topic(n), p) for n in ("tasks", "decisions") for p in parts]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        self.consumer = c
        self.tps = tps

    async def pump(self) -> None:
        """Read forever (run it as a task; cancel it when done)."""
        while True:
            await self.poll(100)

    async def poll(self, timeout_ms: int) -> int:
        """Read one batch of records into the tallies; how many records were read."""
        from dagsched.schemas.messages import BadMessage, DecisionMsg, TaskReadyMsg, WorkflowMsg
        from dagsched.schemas.messages import decode as decode_msg

        got = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=5000)
        n = 0
        decisions_topic = self.s.topic("decisions")
        for tp, recs in got.items():
            for r in recs:
                n += 1
                try:
                    m = decode_msg(r.value)
                except BadMessage:
                    self.undecodable += 1
                    continue
                if tp.topic == decisions_topic and isinstance(m, DecisionMsg):
                    self.records += 1
                    self.decisions[(m.workflow_id, m.task, m.attempt)].append(
                        Decision(r.value, tp.partition, m.model_version, m.arm, m.decided_at)
                    )
                elif isinstance(m, TaskReadyMsg):
                    self.ready_msgs += 1
                    self.asked.add((m.workflow_id, m.task, m.attempt))
                elif isinstance(m, WorkflowMsg):
                    self.wf_partition[m.workflow_id] = tp.partition
        return n

    async def drain(self) -> None:
        """Read until the end offsets seen now."""
        ends = await self.consumer.end_offsets(self.tps)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            positions = [await self.consumer.position(tp) for tp in self.tps]
            if all(p >= ends[tp] for p, tp in zip(positions, self.tps, strict=True)):
                return
            await self.poll(100)

    async def close(self) -> None:
        """Stop the consumer."""
        if self.consumer is not None:
            await self.consumer.stop()
