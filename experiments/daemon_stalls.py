"""Where a paced daemon's latency tail comes from: one replica in this process,
tasks offered at a steady rate, every event-loop callback and garbage collection timed.

Sets up what `experiments/daemon_profile.py` does (the embedded broker, a private `redis-server`,
the default 32 nodes, the shipped champion or `--heuristic`), publishes the workflows, then
offers their ready tasks at `--rate` per second for `--seconds` (confluent-kafka, as the
throughput bench's paced producer; half a second of them first, not measured, while the
reader starts) while a reader takes the decisions. It prints the
submit-to-decision p50 / p99 / max, the callbacks of the event loop that held it longer than
`--slow-ms` (by coroutine, count, total and longest: a callback that long delays every task
waiting behind it) and the garbage collections by generation.

    PYTHONPATH=. .venv/bin/python experiments/daemon_stalls.py [--rate 1000] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# the shared bench harness (and bench/online_shift.py) import as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from harness.gc_pauses import GcPauses
from harness.in_process import champion_daemon, prepare, run_bench
from harness.kafka_io import Reader, pace, producer, publish, workload
from harness.stack import local_stack


class CallbackTimer:
    """Times every callback the event loop runs (`asyncio.Handle._run`), keeping those over a
    threshold by what they ran."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.slow: dict[str, list[float]] = defaultdict(list)
        self._orig = asyncio.events.Handle._run

    def __enter__(self) -> CallbackTimer:
        orig, slow = self._orig, self.slow

        def timed(handle: Any) -> None:
            t = time.perf_counter()
            orig(handle)
            took = time.perf_counter() - t
            if took > self.slow_s:
                slow[_what(handle)].append(took)

        asyncio.events.Handle._run = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.events.Handle._run = self._orig  # type: ignore[method-assign]


def _what(handle: Any) -> str:
    """The coroutine (or function) a handle ran, without addresses."""
    owner = getattr(handle._callback, "__self__", None)
    if isinstance(owner, asyncio.Task):
        return owner.get_coro().__qualname__  # type: ignore[union-attr]
    text = repr(handle)
    m = re.search(r"coro=<([^ >]+)", text)
    if m:
        return m.group(1)
    return re.sub(r" at 0x[0-9a-f]+", "", text)[:80]


async def run(args: argparse.Namespace) -> None:
    async with local_stack("redis://127.0.0.1:1/0", name="stalls", private_redis=True) as st:
        from dagsched.daemon.service import Daemon, set_torch_threads

        s = st.settings
        rds = await prepare(s)
        n = int(args.rate * args.seconds)
        warm = int(args.rate * 0.5)  # half a second first, unmeasured: the reader's start-up
        wfs, ready = workload(warm + n, "s", seed=2)
        p = producer(s)
        await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
        set_torch_threads(s)
        d = Daemon(s, registry=False, freeze_gc=True) if args.heuristic else champion_daemon(s)
        task = asyncio.create_task(d.async_run())
        while d.stats["committed"] < len(wfs):  # assigned, and the workflows stored
            await asyncio.sleep(0.05)
        reader = Reader(s)
        warmed = await asyncio.to_thread(pace, p, s.topic("tasks"), ready[:warm], args.rate)
        while len(reader.arrived) < len(warmed) and not task.done():
            await asyncio.sleep(0.05)
        with GcPauses() as pauses, CallbackTimer(args.slow_ms / 1000) as timer:
            sent = await asyncio.to_thread(
                pace, p, s.topic("tasks"), ready[warm : warm + n], args.rate
            )
            while len(reader.arrived) < len(warmed) + len(sent) and not task.done():
                await asyncio.sleep(0.05)
        reader.close()
        d.stop()
        await task
        await rds.aclose()
    lat = sorted((reader.arrived[k][0] - t) * 1000 for k, t in sent.items() if k in reader.arrived)
    q = statistics.quantiles(lat, n=100)
    arms = sorted({arm for _, arm in reader.arrived.values()})
    print(
        f"{len(lat):,} decisions at {args.rate:,.0f}/s ({', '.join(arms)}): p50 {q[49]:.1f} ms, "
        f"p99 {q[98]:.1f} ms, max {lat[-1]:.1f} ms"
    )
    print(f"callbacks over {args.slow_ms:g} ms:")
    for what, ts in sorted(timer.slow.items(), key=lambda kv: -sum(kv[1])):
        print(f"  {what:48s} {len(ts):6d} x  {sum(ts) * 1000:8.1f} ms  max {max(ts) * 1000:6.1f}")
    pauses.show()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=1000.0, help="tasks offered per second")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--heuristic", action="store_true", help="serve the heuristic, no model")
    ap.add_argument("--slow-ms", type=float, default=5.0, help="report callbacks over this")
    run_bench(run, ap.parse_args())


if __name__ == "__main__":
    main()
