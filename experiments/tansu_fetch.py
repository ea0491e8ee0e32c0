"""How the embedded broker (Tansu, memory storage) reads as a partition fills.

A long run served through the embedded broker slows down as it goes (the soak page, and
`served_drift.py`): its consumers fall behind. This fills one partition of a fresh broker
step by step and, at each size, times what a consumer that keeps up does: read the latest
`--read` records from a fresh consumer (`fetch_max_wait_ms` 5, as the daemon's). It fills
twice: with one record per batch (what a producer that sends and waits makes) and with
`--per-batch` records per batch (a producer that lingers), so that the table says whether
the cost follows the batches the partition holds or its records.

    python experiments/tansu_fetch.py [--sizes 1000,2000,4000,6000,8000,10000,12000]
        [--per-batch 20] [--read 100] [--cap-s 20] [--out experiments/results/tansu_fetch.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dagsched.daemon.broker import TansuBroker

RECORD = b"x" * 200  # about an execution event's size


async def fill(p: AIOKafkaProducer, topic: str, records: int, per_batch: int) -> float:
    """Append `records` in batches of `per_batch` (each batch acknowledged before the next);
    returns batches per second."""
    t = time.perf_counter()
    batches = 0
    for start in range(0, records, per_batch):
        batch = p.create_batch()
        for _ in range(min(per_batch, records - start)):
            batch.append(key=None, value=RECORD, timestamp=None)
        batch.close()
        await (await p.send_batch(batch, topic, partition=0))
        batches += 1
    return batches / (time.perf_counter() - t)


async def read_latest(bootstrap: str, tp: TopicPartition, start: int, want: int, cap_s: float
                      ) -> dict[str, Any]:  # fmt: skip
    """A fresh consumer reads `want` records from offset `start`: seconds and polls, or
    None seconds when it takes longer than `cap_s`."""
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, fetch_max_wait_ms=5, enable_auto_commit=False)
    await c.start()
    try:
        c.assign([tp])
        c.seek(tp, start)
        got = polls = 0
        t = time.perf_counter()
        while got < want:
            if time.perf_counter() - t > cap_s:
                return {"seconds": None, "polls": polls, "records": got}
            out = await c.getmany(timeout_ms=100)
            polls += 1
            got += sum(len(v) for v in out.values())
        return {"seconds": time.perf_counter() - t, "polls": polls, "records": got}
    finally:
        await c.stop()


async def series(sizes: list[int], per_batch: int, want: int, cap_s: float) -> list[dict[str, Any]]:
    rows = []
    with TansuBroker() as b:
        admin = AIOKafkaAdminClient(bootstrap_servers=b.bootstrap)
        await admin.start()
        await admin.create_topics([NewTopic("fill", 1, 1)])
        await admin.close()
        p = AIOKafkaProducer(bootstrap_servers=b.bootstrap, acks="all", linger_ms=0)
        await p.start()
        tp = TopicPartition("fill", 0)
        held = 0
        try:
            for size in sizes:
                rate = await fill(p, "fill", size - held, per_batch)
                held = size
                read = await read_latest(b.bootstrap, tp, held - want, want, cap_s)
                row = {
                    "records": held,
                    "batches": -(-held // per_batch),
                    "produce_batches_per_s": round(rate),
                    "read_s": None if read["seconds"] is None else round(read["seconds"], 3),
                    "read_polls": read["polls"],
                    "read_records": read["records"],
                }
                rows.append(row)
                shown = "over the cap" if row["read_s"] is None else f"{row['read_s']:.2f} s"
                print(
                    f"  {per_batch:>3}/batch  {held:>6} records  {row['batches']:>6} batches  "
                    f"produce {rate:>5.0f} batches/s  read latest {want}: {shown} "
                    f"({read['polls']} polls)",
                    flush=True,
                )
                if read["seconds"] is None:
                    break  # larger sizes only take longer
        finally:
            await p.stop()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000,4000,6000,8000,10000,12000")
    ap.add_argument("--per-batch", type=int, default=20)
    ap.add_argument("--read", type=int, default=100)
    ap.add_argument("--cap-s", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/tansu_fetch.json"))
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    doc: dict[str, Any] = {"args": {k: str(v) for k, v in vars(a).items()}, "runs": {}}
    for per_batch in (1, a.per_batch):
        print(f"{per_batch} record(s) per batch:", flush=True)
        doc["runs"][str(per_batch)] = asyncio.run(series(sizes, per_batch, a.read, a.cap_s))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
