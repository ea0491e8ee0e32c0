"""A passthrough "daemon": the floor that the real daemon's throughput is measured against.

It consumes `dagsched.tasks` in the daemon's consumer group with the daemon's consumer and
producer settings (`dagsched.daemon.kafka`), fetches batches the way `BatchLoop._fetch` does
(`daemon.batch_max` records, `daemon.batch_wait_ms` after the first), produces one message per
record to `dagsched.decisions` (a decision-shaped JSON for a `task_ready`, a short ack for
anything else), waits for every ack (`produce_all`), then commits `{partition: last + 1}`. No
policy, no Redis, no validation beyond `json.loads`.

Run as a process of its own (`python bench/harness/passthrough.py --bootstrap ... --prefix
...`), like a daemon replica: it logs `daemon.started` and `partitions.assigned` as JSON lines
on stderr, serves until SIGTERM, and prints one JSON object of counters on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import signal
import sys
import time
from typing import Any

from dagsched.settings import Settings, load_settings


def _say(event: str, **kw: Any) -> None:
    stamp = dt.datetime.now(dt.UTC).isoformat()
    line = {"event": event, "timestamp": stamp, "level": "info", **kw}
    sys.stderr.write(json.dumps(line) + "\n")
    sys.stderr.flush()


def _answer(value: bytes | None) -> bytes:
    """One output per record, as cheap as it gets: the ids copied into a decision's shape."""
    try:
        m = json.loads(value or b"")
    except ValueError:
        return b'{"type":"passthrough_ack"}'
    if not isinstance(m, dict) or m.get("type") != "task_ready":
        return b'{"type":"passthrough_ack"}'
    wf, task, attempt = json.dumps(m["workflow_id"]), m["task"], m.get("attempt", 0)
    return (
        f'{{"schema_version":1,"type":"decision","workflow_id":{wf},"task":{task},'
        f'"attempt":{attempt},"node":"node-0000","cpu":0.25,"mem":0.25,"max_retries":3,'
        f'"model_version":"passthrough","arm":"fallback","log_prob":0.0,'
        f'"decided_at":{time.time()!r},"latency_ms":0.0}}'
    ).encode()


async def passthrough(settings: Settings, stop: asyncio.Event, stats: dict[str, int]) -> None:
    """Consume, produce one message per record, await the acks, commit; until `stop`."""
    from aiokafka import ConsumerRebalanceListener, TopicPartition

    from dagsched.daemon.kafka import make_consumer, make_producer, produce_all

    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked: Any) -> None:
            _say("partitions.revoked", partitions=sorted(str(tp) for tp in revoked))

        async def on_partitions_assigned(self, assigned: Any) -> None:
            _say("partitions.assigned", partitions=sorted(str(tp) for tp in assigned))

    cfg = settings.daemon
    producer = make_producer(settings)
    consumer = make_consumer(settings, settings.topic_prefix + cfg.group_id)
    out_topic = settings.topic("decisions")
    await producer.start()
    consumer.subscribe([settings.topic("tasks")], listener=Listener())
    await consumer.start()
    _say("daemon.started")
    try:
        while not stop.is_set():
            got = await consumer.getmany(timeout_ms=100, max_records=cfg.batch_max)
            records = [r for rs in got.values() for r in rs]
            if not records:
                continue
            deadline = time.monotonic() + cfg.batch_wait_ms / 1000
            while len(records) < cfg.batch_max and (left := deadline - time.monotonic()) > 0:
                more = await consumer.getmany(
                    timeout_ms=max(1, int(left * 1000)), max_records=cfg.batch_max - len(records)
                )
                records.extend(r for rs in more.values() for r in rs)
            outputs = [(out_topic, r.key, _answer(r.value)) for r in records]
            await produce_all(producer, outputs)
            offsets: dict[Any, int] = {}
            for r in records:
                tp = TopicPartition(r.topic, r.partition)
                offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
            await consumer.commit(offsets)
            stats["records"] += len(records)
            stats["batches"] += 1
    finally:
        for closer in (consumer.stop, producer.stop):
            with contextlib.suppress(Exception):
                await closer()


def main() -> None:
    """The passthrough process: serves until SIGTERM, then prints its counters on stdout."""
    ap = argparse.ArgumentParser(description="bench passthrough (started by the bench)")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--home", required=True)
    args = ap.parse_args()
    s = load_settings(
        None,
        {"kafka_bootstrap": args.bootstrap, "topic_prefix": args.prefix, "home": args.home,
         "log_level": "WARNING"},
        environ={},
    )  # fmt: skip
    stats = {"records": 0, "batches": 0}

    async def run() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await passthrough(s, stop, stats)

    asyncio.run(run())
    _say("daemon.stopped", **stats)
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
