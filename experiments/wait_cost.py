"""What `redis_wait_replicas: 1` adds to one batch: the fence (a one-key write and `WAIT 1`)
against the same pipeline without the WAIT, on a Sentinel set on loopback (a primary, a
replica, three sentinels), through the daemon's own client and `ReplicaWait`.

    PYTHONPATH=. .venv/bin/python experiments/wait_cost.py [--calls 2000]

Prints medians and p99 in ms; writes experiments/results/wait_cost.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from dagsched.daemon.redis_sentinel import SentinelSet
from dagsched.daemon.redis_state import connect
from dagsched.daemon.replication import ReplicaWait
from dagsched.settings import load_settings

OUT = Path(__file__).resolve().parent / "results" / "wait_cost.json"


async def measure(ss: SentinelSet, calls: int) -> dict[str, dict[str, float]]:
    s = load_settings(None, {**ss.overrides(), "redis_wait_replicas": 1}, environ={})
    redis = connect(s)
    stats: dict[str, int] = defaultdict(int)
    fence = ReplicaWait(redis, s, stats)
    times: dict[str, list[float]] = {"fence (INCR + WAIT 1)": [], "INCR alone": []}
    try:
        for _ in range(calls):
            t = time.perf_counter()
            assert await fence()
            times["fence (INCR + WAIT 1)"].append(time.perf_counter() - t)
            t = time.perf_counter()
            async with redis.pipeline(transaction=False) as pipe:
                pipe.incr(fence.key)
                await pipe.execute()
            times["INCR alone"].append(time.perf_counter() - t)
    finally:
        await redis.aclose()
    out = {
        name: {
            "median_ms": float(np.median(v) * 1000),
            "p99_ms": float(np.percentile(v, 99) * 1000),
        }
        for name, v in times.items()
    }
    out["shortfalls"] = {"count": float(stats["wait_short"])}
    return out


def main() -> None:
    """Start the set, measure, print, write."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    args = ap.parse_args()
    with SentinelSet() as ss:
        doc = asyncio.run(measure(ss, args.calls))
    for name, row in doc.items():
        print(f"{name:24s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"calls": args.calls, **doc}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
