"""Profile one daemon replica draining a backlog, in this process.

Sets up what `bench/daemon_throughput.py` does (the embedded broker, a private `redis-server`,
the default 32 nodes as heartbeats, a backlog of the default scenario's ready tasks published
before the daemon starts), then runs `Daemon` here, serving the heuristic fallback or
(`--gnn`) the shipped champion, with the garbage collector frozen after start-up as the
`dagsched daemon` process does. Between 500 decisions and 500 before the end it measures:
- wall and CPU time per decision of this process, and the CPU seconds of Redis and the broker;
- the time spent in each step of a batch (fetch, process, the Redis reads and writes, produce,
  commit; `--steps`), or a cProfile of the whole process (`--profile FILE`, CPU time unless
  `--wall`), printed by cumulative and own time;
- garbage collections: how many, in total and the longest, per generation.

    PYTHONPATH=. .venv/bin/python experiments/daemon_profile.py [--gnn] [--tasks 20000]
        [--steps | --profile /tmp/daemon.prof [--wall]]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

# the shared bench harness (and bench/online_shift.py) import as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from harness.gc_pauses import GcPauses
from harness.in_process import champion_daemon, prepare, run_bench
from harness.kafka_io import producer, publish, workload
from harness.stack import local_stack
from harness.throughput_report import cpu_seconds


def children_cpu() -> dict[str, float]:
    """CPU seconds of this process's children (redis-server, the broker) by name and pid."""
    out = {}
    me = os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
            out[f"{name}:{pid}"] = cpu_seconds(int(pid)) or 0.0
    return out


class Steps:
    """Wall time spent in named awaitables, by wrapping them where they are looked up."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, obj: Any, name: str, label: str) -> None:
        f = getattr(obj, name)

        async def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return await f(*a, **k)
            finally:
                self.wall[label] += time.perf_counter() - t
                self.calls[label] += 1

        setattr(obj, name, timed)

    def reset(self) -> None:
        self.wall.clear()
        self.calls.clear()

    def show(self) -> None:
        for k, w in self.wall.items():
            n = self.calls[k]
            print(f"  {k:16s} {w:7.3f} s {n:7d} calls {w / max(1, n) * 1000:7.2f} ms/call")


async def run(args: argparse.Namespace) -> None:

    import dagsched.daemon.batch_loop as batch_mod
    from dagsched.daemon.service import Daemon, set_torch_threads

    async with local_stack("redis://127.0.0.1:1/0", name="profile", private_redis=True) as st:
        s = st.settings
        rds = await prepare(s)
        wfs, ready = workload(args.tasks, "b", seed=1)
        p = producer(s)
        await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
        await asyncio.to_thread(publish, p, s.topic("tasks"), [(k, v) for _, k, v in ready])
        print(f"published {len(ready):,} tasks of {len(wfs):,} workflows")
        set_torch_threads(s)
        d = champion_daemon(s) if args.gnn else Daemon(s, registry=False, freeze_gc=True)
        steps = Steps()
        if args.steps:
            steps.wrap(d.batches, "_fetch", "fetch")
            steps.wrap(d.batches, "process", "process")
            steps.wrap(batch_mod, "produce_all", "produce")
            for name in ("stored", "put_workflows", "round_inputs", "decide_many", "progress"):
                steps.wrap(d.store, name, name)
            steps.wrap(d.rs, "put_decision_logs", "put_logs")
        task = asyncio.create_task(d.async_run())
        while d.consumer is None:
            await asyncio.sleep(0.01)
        if args.steps:
            while not hasattr(d.consumer, "commit"):
                await asyncio.sleep(0.01)
            steps.wrap(d.consumer, "commit", "commit")
        while d.stats["decisions"] < 500:
            await asyncio.sleep(0.01)
        pauses = GcPauses()
        prof = None
        if args.profile:
            prof = cProfile.Profile() if args.wall else cProfile.Profile(time.process_time)
        steps.reset()
        pauses.__enter__()
        others0 = children_cpu()
        n0, t0, c0 = d.stats["decisions"], time.perf_counter(), time.process_time()
        if prof is not None:
            prof.enable()
        while d.stats["decisions"] < len(ready) - 500 and not task.done():
            await asyncio.sleep(0.01)
        if prof is not None:
            prof.disable()
        wall, cpu, n = time.perf_counter() - t0, time.process_time() - c0, d.stats["decisions"] - n0
        pauses.__exit__()
        others = {k: v - others0.get(k, 0.0) for k, v in children_cpu().items()}
        d.stop()
        await task
        await rds.aclose()
    print(
        f"{n:,} decisions in {wall:.2f} s ({n / wall:,.0f}/s), this process {cpu:.2f} s CPU "
        f"({cpu / n * 1e6:,.0f} us a decision); others' CPU s: "
        + ", ".join(f"{k} {v:.2f}" for k, v in others.items())
    )
    steps.show()
    pauses.show()
    if prof is not None:
        prof.dump_stats(args.profile)
        stats = pstats.Stats(args.profile)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(25)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gnn", action="store_true", help="serve the shipped champion")
    ap.add_argument("--tasks", type=int, default=20_000, help="backlog of ready tasks")
    ap.add_argument("--steps", action="store_true", help="time each step of a batch")
    ap.add_argument("--profile", default=None, help="cProfile output file")
    ap.add_argument("--wall", action="store_true", help="profile wall time, not CPU time")
    run_bench(run, ap.parse_args())


if __name__ == "__main__":
    main()
