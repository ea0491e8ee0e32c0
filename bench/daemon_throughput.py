"""Daemon throughput: decisions per second through the daemon, with the GNN,
measured against a passthrough; latency under paced load; the served path alone; Redis bytes.

Setup, all on this machine: the embedded Tansu broker, a private `redis-server`, an MLflow
SQLite registry in a temporary home holding the shipped champion (`models/champion`, registered
as the daemon tests do), and the default 32-node cluster written into Redis as heartbeats.
Workload: the default scenario's workflows (8-40 tasks), every task of each published as a
`task_ready` (no `at`, so no batch waits for the updater), tasks shuffled across workflows.

Configurations, each on a fresh topic and key prefix (its own consumer group, decision store
and ledger), as separate processes like deployed replicas (code defaults + configs/default.yaml:
`batch_max` 256, `batch_wait_ms` 5 while the broker holds records not yet fetched, acks=all,
commit after the acks; the passthrough still waits `batch_wait_ms` after a batch's first record):
- passthrough: `bench/harness/passthrough.py`, the daemon's consumer, producer, batching,
  acks and commits, one output per record; no policy, no Redis;
- heuristic: `dagsched daemon --no-registry` (the least-loaded fallback);
- gnn: `dagsched daemon` serving the champion; gnn x2: two of them in one group.

Per configuration:
- saturation: a backlog (`--backlog` tasks, >= 500 workflows) is published before the
  replicas start; decisions/s = decisions between the 10th and 90th percentile of their
  arrival times / the time between those (startup and the tail left out; all-in also given);
  and the replicas' CPU time (user + system, start-up included) per decision, the steadier
  figure on a machine shared with other jobs;
- latency (`--latency-configs`; `gnn2` as deployed: two replicas in one group sharing the
  tasks topic's partitions, keyed by workflow, and the 2 cores): a paced producer offers 200,
  1,000 and 5,000 tasks/s for `--pace-s` seconds each (workflows published first); latency =
  arrival of the decision at this process's reader - the moment the task was handed to the
  producer;
- Redis: MEMORY USAGE of every key under the prefix after the backlog, by key family, / the
  backlog's decisions.

The event side (`harness/event_side.py`; three events per decision: started, finished or
failed, a heartbeat):
- updater: a backlog of `--events` events (and the reservations of their decisions) published
  first, then `dagsched updater` started alone: events/s between 10% and 90% of the backlog
  committed, against the passthrough's records/s; its CPU per event; ledgers left after;
- closedloop: a daemon (serving the champion; the heuristic with `--loop-policy heuristic`)
  offered `--loop-rate` tasks/s (`task_ready` with `at`, so batches wait for the updater as
  deployed) for `--loop-decisions` tasks; a feeder reports each decision's attempt started, a
  heartbeat, and its end a second later; the updater (the daemon's own, or with
  `--loop-updater process` `dagsched updater` alone) is timed from when it applies a first
  probe event; its lag (per partition, the newest event acked minus the newest its group
  committed, in job-queue seconds; the worst partition) sampled every 0.1 s; afterwards the
  ledgers left, Redis bytes per decision, and per (decision/s) held for `daemon.decision_ttl_s`
  and `daemon.workflow_ttl_s`.

Served path alone: `GNNScheduler.place` on batches of 64 tasks (the daemon's `batch_max` was 64)
with real decision points of the default scenario scaled to 32, 256 and 2,048 nodes (played
by least-loaded), in this process, no broker.

The workload and the Kafka traffic are `harness/kafka_io.py`, the measures and tables
`harness/throughput_report.py`. Prints tables (stderr with `--json`), writes
`bench/results/daemon_throughput.json` (`--quick`: `daemon_throughput_quick.json`); `--json`
prints one JSON object on stdout.

    PYTHONPATH=. .venv/bin/python bench/daemon_throughput.py [--quick] [--json]
        [--configs passthrough,heuristic,gnn,gnn2,updater,closedloop] [--backlog 20000]
        [--pace-s 8] [--events 150000] [--loop-decisions 60000] [--loop-rate 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from harness.event_side import closed_loop, updater_saturation
from harness.kafka_io import Key, Reader, heartbeats, pace, producer, publish, workload
from harness.replicas import Replica, start_replica, stop_replica, wait_until
from harness.stack import REPO, git_state, local_stack
from harness.throughput_report import (
    RATES,
    cpu_per_decision,
    cpu_seconds,
    fmt_events,
    fmt_rate,
    redis_bytes,
    saturation,
    show,
    stopped_stats,
    summary,
)
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from dagsched.settings import Settings

CONFIGS = ("passthrough", "heuristic", "gnn", "gnn2", "updater", "closedloop")
EVENT_PHASES = ("updater", "closedloop")
SERVED_NODES = (32, 256, 2048)


# -- one configuration ------------------------------------------------------------------------


class Bench:
    """The shared stack, the console and the progress display."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console

    @contextlib.contextmanager
    def progress(self, what: str, total: int) -> Iterator[Callable[[int], None]]:
        with Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TimeElapsedColumn(), console=self.console, transient=True,
        ) as bar:  # fmt: skip
            task = bar.add_task(what, total=total)
            yield lambda n: bar.update(task, completed=n)

    async def wait_decided(
        self,
        reader: Reader,
        keys: list[Key],
        what: str,
        timeout: float,
        replicas: list[Replica],
        cpu: list[tuple[int, float]] | None = None,
    ) -> bool:
        """Until every key has a decision (False on timeout); a replica exiting is an error.
        `cpu` gets (decided, the replicas' CPU seconds) at every look."""
        deadline = time.monotonic() + timeout
        with self.progress(what, len(keys)) as update:
            while True:
                done = sum(1 for k in keys if k in reader.arrived)
                used = [cpu_seconds(r.proc.pid) for r in replicas]
                if cpu is not None and None not in used:
                    cpu.append((done, sum(used)))  # type: ignore[arg-type]
                update(done)
                if done == len(keys):
                    return True
                for r in replicas:
                    if r.proc.returncode is not None:
                        raise RuntimeError(f"{r.index} exited: see {r.log_path}")
                if time.monotonic() > deadline:
                    return False
                await asyncio.sleep(0.1)

    async def config(self, name: str, base: Settings, registered: bool) -> dict[str, Any]:
        """Run one configuration: backlog, then paced rates; its measures."""
        import redis.asyncio as aioredis

        from dagsched.daemon.broker import ensure_topics
        from dagsched.daemon.redis_state import RedisState

        a = self.args
        s = base.model_copy(update={"topic_prefix": f"{base.topic_prefix}{name}."})
        await ensure_topics(s)
        rds = aioredis.from_url(s.redis_url)
        rs = RedisState(rds, s)
        for hb in heartbeats():
            await rs.apply_event(hb)
        mem0 = (await rds.info("memory"))["used_memory"]
        wfs, ready = workload(a.backlog, "b", seed=1)
        p = producer(s)
        t0 = time.monotonic()
        await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
        await asyncio.to_thread(publish, p, s.topic("tasks"), [(key, v) for _, key, v in ready])
        self.console.log(
            f"({name}) backlog: {len(ready):,} tasks of {len(wfs):,} workflows published in "
            f"{time.monotonic() - t0:.1f} s"
        )
        reader = Reader(s)
        n = 2 if name == "gnn2" else 1
        replicas: list[Replica] = []
        out: dict[str, Any] = {"replicas": n, "backlog_tasks": len(ready), "workflows": len(wfs)}
        try:
            started = time.time()
            replicas = [await self.start(name, i, s, registered) for i in range(n)]
            keys = [k for k, _, _ in ready]
            cpu: list[tuple[int, float]] = []
            ok = await self.wait_decided(
                reader, keys, f"({name}) backlog", a.backlog_timeout, replicas, cpu
            )
            out["saturation"] = saturation(reader, keys, ok, started)
            out["saturation"]["replica_cpu_us"] = cpu_per_decision(cpu, len(keys))
            self.console.log(f"({name}) saturation: {fmt_rate(out['saturation'])}")
            if name != "passthrough":
                out["redis"] = await redis_bytes(rds, s, len(keys), mem0)
            if name in a.latency_configs:
                out["latency"] = {}
                for rate in RATES:
                    out["latency"][str(rate)] = await self.paced(
                        name, s, p, reader, rds, rate, replicas
                    )
        finally:
            out["stopped"] = [await self.stop(r) for r in replicas]
            reader.close()
            await rds.aclose()
        out["conflicts"] = reader.conflicts
        return out

    async def start(self, name: str, i: int, s: Settings, registered: bool) -> Replica:
        if name == "passthrough":
            return await start_passthrough(i, s)
        if name.startswith("gnn") and registered:
            # serve the model from the first batch: wait for its load however long it takes
            # on a busy machine (the daemon's default grace is 10 s, then the fallback serves)
            return await start_replica(
                i, s, s.home, self.args.torch_threads, env={"DAGSCHED_DAEMON__GRACE_S": "120"}
            )
        return await start_replica(i, s, s.home, self.args.torch_threads, ("--no-registry",))

    async def stop(self, r: Replica) -> dict[str, Any]:
        code = await stop_replica(r)
        stats = stopped_stats(r.log_path)
        return {"exit": code, **stats}

    async def paced(
        self, name: str, s: Settings, p: Any, reader: Reader, rds: Any, rate: int, replicas: Any
    ) -> dict[str, Any]:
        """Offer `rate` tasks/s for `pace_s` seconds; latency per task."""
        a = self.args
        n = int(rate * a.pace_s)
        wfs, ready = workload(n, f"r{rate}", seed=rate)
        ready = ready[:n]
        acks0 = reader.acks
        await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
        # the workflows are stored (or acked) before the paced tasks start
        if name == "passthrough":
            await wait_until(lambda: reader.acks - acks0 >= len(wfs), 60, "acks", replicas)
        else:
            keys = [f"{s.topic_prefix}dagsched:wf:{w}" for w, _ in wfs]
            deadline = time.monotonic() + 60
            while await rds.exists(*keys) < len(keys) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        sent = await asyncio.to_thread(pace, p, s.topic("tasks"), ready, rate)
        offered = len(ready) / max(1e-9, max(sent.values()) - min(sent.values()))
        keys = [k for k, _, _ in ready]
        ok = await self.wait_decided(reader, keys, f"({name}) {rate}/s", a.drain_timeout, replicas)
        lat = np.array([reader.arrived[k][0] - sent[k] for k in keys if k in reader.arrived])
        res = {
            **_split(reader, keys, sent),
            "offered_per_s": offered,
            "tasks": len(keys),
            "decided": int(lat.size),
            "complete": ok,
            "p50_ms": float(np.percentile(lat, 50) * 1000) if lat.size else None,
            "p99_ms": float(np.percentile(lat, 99) * 1000) if lat.size else None,
            "max_ms": float(lat.max() * 1000) if lat.size else None,
        }
        self.console.log(
            f"({name}) {rate}/s offered ({offered:,.0f}): p50 {res['p50_ms'] or 0:,.1f} ms, "
            f"p99 {res['p99_ms'] or 0:,.1f} ms"
            + (
                f" (medians: to fetch {res['to_fetch_ms']:.1f}, in batch {res['in_batch_ms']:.1f},"
                f" out {res['out_ms']:.1f} ms)"
                if "out_ms" in res
                else ""
            )
        )
        return res


def _split(reader: Reader, keys: list[Key], sent: dict[Key, float]) -> dict[str, Any]:
    """Where a decision's latency went, medians in ms, from the times it carries (one clock
    on this machine): `to_fetch` from the producer to the batch's fetch (linger, broker,
    the consumer's fetch, a batch in progress), `in_batch` from the fetch to the decision
    built (decode, Redis reads, the policy call), `out` from there to this reader (the
    reservation script, the decision log, produce and acks, the reader's fetch)."""
    parts: dict[str, list[float]] = {"to_fetch_ms": [], "in_batch_ms": [], "out_ms": []}
    for k in keys:
        raw = reader.raw.get(k)
        if raw is None:
            continue
        d = json.loads(raw)
        if "latency_ms" not in d:  # the passthrough's outputs carry no times
            return {}
        fetched = d["decided_at"] - d["latency_ms"] / 1000
        parts["to_fetch_ms"].append((fetched - sent[k]) * 1000)
        parts["in_batch_ms"].append(d["latency_ms"])
        parts["out_ms"].append((reader.arrived[k][0] - d["decided_at"]) * 1000)
    return {k: float(np.median(v)) for k, v in parts.items() if v}


async def start_passthrough(i: int, s: Settings) -> Replica:
    """The passthrough process, wrapped like a replica (its log lines are read the same way)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "bench" / "harness" / "passthrough.py"),
        "--bootstrap", s.kafka_bootstrap, "--prefix", s.topic_prefix, "--home", str(s.home),
        cwd=str(REPO), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    r = Replica(i, proc, s.home / f"passthrough-{i}.log", s.topic("tasks"))
    r.reader = asyncio.create_task(r.read())
    return r


# -- served path alone ------------------------------------------------------------------------


def served(nodes: int, seconds: float, batch: int, warmup: int) -> dict[str, Any]:
    """`GNNScheduler.place` on batches of `batch` real decision points at `nodes` nodes."""
    from dataclasses import replace

    from dagsched.policy.bundle import load_bundle
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import make_policy, stream_workflows
    from dagsched.sim.snapshot import cluster_view, task_view

    base = ScenarioConfig()
    sc = replace(base, cluster=base.cluster.scaled(nodes))
    sim = Simulator(sc, stream_workflows(sc, 0, 100_000), seed=0)
    policy = make_policy("least_loaded", 0)
    tasks = []
    steps = 0
    while (b := sim.advance()) is not None:
        steps += 1
        if steps > warmup:
            tasks += [task_view(t) for t in b]
            if len(tasks) >= batch:
                break
        sim.apply(policy.decide(sim, b), b)
    view, tasks = cluster_view(sim), tasks[:batch]
    sched = load_bundle(REPO / "models" / "champion", "bench", smoke=False)
    first = time.perf_counter()
    sched.place(view, tasks)  # warm-up (compiles the serving loop where numba's cache lacks it)
    first_ms = (time.perf_counter() - first) * 1000
    net = sched.numpy_net()
    calls, t0 = 0, time.perf_counter()
    cpu: list[float] = []  # per batch, the process's CPU seconds (BLAS threads included)
    while (wall := time.perf_counter() - t0) < seconds or calls < 2:
        if net is not None:  # every batch encodes its DAGs, as new workflow states would
            net.encodings.clear()
        c0 = time.process_time()
        sched.place(view, tasks)
        cpu.append(time.process_time() - c0)
        calls += 1
    import torch

    return {
        "nodes": view.n,
        "batch": len(tasks),
        "torch_threads": torch.get_num_threads(),
        "calls": calls,
        "per_s": calls * len(tasks) / wall,
        "ms_per_batch": wall / calls * 1000,
        # decisions per CPU-second (median batch): moves far less than per_s on a shared
        # machine; process time, so BLAS threads spinning on small products count
        "cpu_per_s": len(tasks) / max(statistics.median(cpu), 1e-9),
        "first_batch_ms": first_ms,
        # the compiled serving loop ran (policy/greedy_kernel.py), not the numpy loop
        "compiled_loop": type(sched.last_observations).__name__ == "LazyObservations",
    }


# -- the event side ---------------------------------------------------------------------------


async def event_phases(bench: Bench, base: Settings, registered: bool) -> dict[str, Any]:
    """The updater at saturation and the closed loop (those of `--configs`)."""
    a = bench.args
    out: dict[str, Any] = {}

    def prefixed(name: str) -> Settings:
        return base.model_copy(update={"topic_prefix": f"{base.topic_prefix}{name}."})

    if "updater" in a.configs:
        out["updater"] = await updater_saturation(
            prefixed("updater"), a.events, bench.console.log, a.backlog_timeout
        )
        bench.console.log(f"(updater) {fmt_events(out['updater'])}")
    if "closedloop" in a.configs:
        name = "gnn" if registered and a.loop_policy == "gnn" else "heuristic"
        separate = a.loop_updater == "process"

        async def start(s: Settings) -> Replica:
            if not separate:
                return await bench.start(name, 0, s, registered)
            extra = () if name == "gnn" else ("--no-registry",)
            return await start_replica(0, s, s.home, a.torch_threads, ("--no-updater", *extra),
                                       env={"DAGSCHED_DAEMON__GRACE_S": "120"})  # fmt: skip

        out["closedloop"] = await closed_loop(
            prefixed("closedloop"), start, a.loop_decisions, a.loop_rate, bench.console.log,
            separate,
        )  # fmt: skip
        out["closedloop"]["config"] = name
    return out


# -- the run ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from dagsched.registry.store import Registry

    wall0 = time.monotonic()
    load0 = os.getloadavg()
    doc: dict[str, Any] = {"configs": {}}
    # --sentinel: a primary, a replica and three sentinels (docs/operations/redis-failover.md)
    from dagsched.daemon.redis_sentinel import SentinelSet

    ha = await asyncio.to_thread(SentinelSet().start) if args.sentinel else None
    over: dict[str, Any] = {"redis_wait_replicas": args.wait_replicas}
    if ha is not None:
        over.update({**ha.overrides(), "redis_url": ha.primary.url})
    async with contextlib.AsyncExitStack() as exits, local_stack(
        ha.primary.url if ha else "redis://127.0.0.1:1/0", name="throughput",
        say=console.log, private_redis=ha is None, overrides=over,
    ) as stack:  # fmt: skip
        if ha is not None:
            exits.callback(ha.stop)
        s = stack.settings
        registered = False
        loop_gnn = "closedloop" in args.configs and args.loop_policy == "gnn"
        if any(c.startswith("gnn") for c in args.configs) or loop_gnn:
            version = await asyncio.to_thread(Registry(s).ensure_champion)
            registered = version is not None
            console.log(f"registry: champion v{version} (the shipped bundle)")
        bench = Bench(args, console)
        for name in args.configs:
            if name not in EVENT_PHASES:
                doc["configs"][name] = await bench.config(name, s, registered)
        doc["events"] = await event_phases(bench, s, registered)
    # the served path runs with the daemon's torch threads, as in a daemon process
    threads = getattr(stack.settings.daemon, "torch_threads", 0)
    if threads:
        import torch

        torch.set_num_threads(threads)
    served_rows = []
    for n in args.served_nodes:
        with console.status(f"served path at {n} nodes"):
            row = await asyncio.to_thread(served, n, args.served_s, 64, args.served_warmup)
        console.log(
            f"served path, {row['nodes']} nodes: {row['per_s']:,.0f} decisions/s,"
            f" {row['cpu_per_s']:,.0f} per CPU-second"
        )
        served_rows.append(row)
    doc["served"] = served_rows
    doc["setup"] = {
        "quick": args.quick,
        "backlog": args.backlog,
        "pace_s": args.pace_s,
        "events": args.events,
        "loop_decisions": args.loop_decisions,
        "loop_rate": args.loop_rate,
        "loop_updater": args.loop_updater,
        "loop_policy": args.loop_policy,
        "rates": list(RATES),
        "torch_threads": args.torch_threads,
        "redis": "sentinel" if args.sentinel else "single",
        "redis_wait_replicas": args.wait_replicas,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "load_avg_start": load0,
        "load_avg_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "git": git_state(),
    }
    doc["wall_s"] = time.monotonic() - wall0
    doc["summary"] = summary(doc)
    return doc


def main() -> None:
    """Parse the options, run, print the tables, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller run (under 3 minutes)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--latency-configs", default="passthrough,heuristic,gnn,gnn2")
    ap.add_argument("--backlog", type=int, default=None, help="tasks (default 20000; quick 3000)")
    ap.add_argument("--pace-s", type=float, default=None, help="seconds per offered rate")
    ap.add_argument("--events", type=int, default=None, help="updater backlog (150000; quick 30k)")
    ap.add_argument("--loop-decisions", type=int, default=None, help="closed loop (60000; 10k)")
    ap.add_argument("--loop-rate", type=float, default=1000.0, help="closed loop tasks/s offered")
    ap.add_argument(
        "--loop-policy",
        choices=("gnn", "heuristic"),
        default="gnn",
        help="closed loop: the daemon serves the champion, or the fallback",
    )
    ap.add_argument(
        "--loop-updater",
        choices=("daemon", "process"),
        default="daemon",
        help="closed loop: the daemon's own updater, or dagsched updater alone",
    )
    ap.add_argument("--served-nodes", default=",".join(map(str, SERVED_NODES)))
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--sentinel", action="store_true", help="Redis as primary+replica+sentinels")
    ap.add_argument("--wait-replicas", type=int, default=0, help="redis_wait_replicas (WAIT)")
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    args.latency_configs = set(args.latency_configs.split(","))
    args.served_nodes = [int(n) for n in args.served_nodes.split(",") if n]
    if args.quick:
        args.backlog = args.backlog or 3000
        args.events = args.events or 30_000
        args.loop_decisions = args.loop_decisions or 10_000
        args.pace_s = args.pace_s or 1.0
        args.latency_configs &= {"gnn", "gnn2"}
        args.served_s, args.served_warmup = 1.0, 30
        args.backlog_timeout, args.drain_timeout = 60.0, 30.0
    else:
        args.backlog = args.backlog or 20_000
        args.events = args.events or 150_000
        args.loop_decisions = args.loop_decisions or 60_000
        args.pace_s = args.pace_s or 8.0
        args.served_s, args.served_warmup = 4.0, 200
        args.backlog_timeout, args.drain_timeout = 600.0, 300.0
    name = "daemon_throughput_quick.json" if args.quick else "daemon_throughput.json"
    out = args.out or REPO / "bench" / "results" / name
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    console = Console(stderr=True, width=120)
    doc = asyncio.run(run(args, console))
    show(doc, console if args.json else Console(width=120))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2, default=float) + "\n")
    console.log(f"wrote {out}")
    if args.json:
        print(json.dumps({**doc["summary"], "result": str(out)}, default=float))


if __name__ == "__main__":
    main()
