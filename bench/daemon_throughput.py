"""Daemon throughput (issue 13): decisions per second through the daemon, with the GNN,
measured against a passthrough; latency under paced load; the served path alone; Redis bytes.

Setup, all on this machine: the embedded Tansu broker, a private `redis-server`, an MLflow
SQLite registry in a temporary home holding the shipped champion (`models/champion`, registered
as the daemon tests do), and the default 32-node cluster written into Redis as heartbeats.
Workload: the default scenario's workflows (8-40 tasks), every task of each published as a
`task_ready` (no `at`, so no batch waits for the updater), tasks shuffled across workflows.

Configurations, each on a fresh topic and key prefix (its own consumer group, decision store
and ledger), as separate processes like deployed replicas (code defaults + configs/default.yaml:
`batch_max` 64, `batch_wait_ms` 5, acks=all, commit after the acks):
- passthrough: `bench/harness/passthrough.py`, the daemon's consumer, producer, batching,
  acks and commits, one output per record; no policy, no Redis;
- heuristic: `dagsched daemon --no-registry` (the least-loaded fallback);
- gnn: `dagsched daemon` serving the champion; gnn x2: two of them in one group.

Per configuration:
- saturation: a backlog (`--backlog` tasks, >= 500 workflows) is published before the
  replicas start; decisions/s = decisions between the 10th and 90th percentile of their
  arrival times / the time between those (startup and the tail left out; all-in also given);
- latency (single-replica configurations): a paced producer offers 200, 1,000 and 5,000
  tasks/s for `--pace-s` seconds each (workflows published first); latency = arrival of the
  decision at this process's reader - the moment the task was handed to the producer;
- Redis: MEMORY USAGE of every key under the prefix after the backlog, by key family, / the
  backlog's decisions.
Served path alone: `GNNScheduler.place` on batches of 64 tasks (the daemon's `batch_max`)
with real decision points of the default scenario scaled to 32, 256 and 2,048 nodes (played
by least-loaded), in this process, no broker.

Prints tables (stderr with `--json`), writes `bench/results/daemon_throughput.json`
(`--quick`: `daemon_throughput_quick.json`); `--json` prints one JSON object on stdout.

    PYTHONPATH=. .venv/bin/python bench/daemon_throughput.py [--quick] [--json]
        [--configs passthrough,heuristic,gnn,gnn2] [--backlog 20000] [--pace-s 8]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from harness.replicas import Replica, start_replica, stop_replica, wait_until
from harness.stack import REPO, git_state, local_stack
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagsched.settings import Settings

CONFIGS = ("passthrough", "heuristic", "gnn", "gnn2")
RATES = (200, 1000, 5000)
SERVED_NODES = (32, 256, 2048)
TARGETS = {
    "gnn_per_s": 5000.0,
    "gnn_vs_passthrough": 0.5,
    "p99_ms_at_1000": 30.0,
    "p99_ms_at_5000": 100.0,
    "served_per_s_32_nodes": 10_000.0,
    "served_per_s_2048_nodes": 1000.0,
}
Key = tuple[str, int, int]


# -- workload ---------------------------------------------------------------------------------


def workload(tasks: int, tag: str, seed: int) -> tuple[list[tuple[str, bytes]], list[Any]]:
    """Workflow messages (id, bytes) and their `task_ready` messages (key, id, bytes), at least
    `tasks` of them, every task of every workflow, shuffled across workflows."""
    from dagsched.schemas.messages import TaskReadyMsg
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.runner import stream_workflows
    from dagsched.sim.wire import to_message

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


def producer(s: Settings) -> Any:
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": s.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 5,  # librdkafka's default; 1 ms sent 5x more requests for Tansu to serve
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
        self, reader: Reader, keys: list[Key], what: str, timeout: float, replicas: list[Replica]
    ) -> bool:
        """Until every key has a decision (False on timeout); a replica exiting is an error."""
        deadline = time.monotonic() + timeout
        with self.progress(what, len(keys)) as update:
            while True:
                done = sum(1 for k in keys if k in reader.arrived)
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
            ok = await self.wait_decided(
                reader, keys, f"({name}) backlog", a.backlog_timeout, replicas
            )
            out["saturation"] = saturation(reader, keys, ok, started)
            self.console.log(f"({name}) saturation: {_fmt_rate(out['saturation'])}")
            if name != "passthrough":
                out["redis"] = await redis_bytes(rds, s, len(keys), mem0)
            if n == 1 and name in a.latency_configs:
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
        stats = _stopped_stats(r.log_path)
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
        )
        return res


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


def _stopped_stats(log: Path) -> dict[str, Any]:
    """The counters of the replica's `daemon.stopped` line (decisions, duplicates, ...)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if ev.get("event") == "daemon.stopped":
                    out = {k: v for k, v in ev.items() if isinstance(v, int)}
    return out


def saturation(reader: Reader, keys: list[Key], complete: bool, started: float) -> dict[str, Any]:
    """Decisions/s over the middle 80% of the backlog's decisions, and all-in."""
    got = [reader.arrived[k] for k in keys if k in reader.arrived]
    times = np.sort(np.array([t for t, _ in got]))
    arms: dict[str, int] = defaultdict(int)
    for _, arm in got:
        arms[arm] += 1
    out: dict[str, Any] = {"decided": len(got), "complete": complete, "arms": dict(arms)}
    if len(times) >= 10:
        lo, hi = int(0.1 * len(times)), int(0.9 * len(times)) - 1
        out["per_s"] = (hi - lo) / max(1e-9, times[hi] - times[lo])
        out["per_s_all"] = (len(times) - 1) / max(1e-9, times[-1] - times[0])
        out["first_decision_s"] = times[0] - started
        out["drain_s"] = times[-1] - times[0]
    return out


async def redis_bytes(rds: Any, s: Settings, decisions: int, mem0: int) -> dict[str, Any]:
    """MEMORY USAGE of every key under the configuration's prefix, by key family."""
    prefix = f"{s.topic_prefix}dagsched:"
    keys = [k async for k in rds.scan_iter(match=f"{prefix}*", count=2000)]
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i in range(0, len(keys), 1000):
        pipe = rds.pipeline(transaction=False)
        for k in keys[i : i + 1000]:
            pipe.memory_usage(k, samples=0)
        for k, used in zip(keys[i : i + 1000], await pipe.execute(), strict=True):
            family = k.decode()[len(prefix) :].split(":")[0]
            by[family][0] += 1
            by[family][1] += int(used or 0)
    total = sum(b for _, b in by.values())
    mem1 = (await rds.info("memory"))["used_memory"]
    return {
        "decisions": decisions,
        "keys": len(keys),
        "bytes": total,
        "bytes_per_decision": total / max(1, decisions),
        "used_memory_delta_per_decision": (mem1 - mem0) / max(1, decisions),
        "families": {f: {"keys": c, "bytes": b} for f, (c, b) in sorted(by.items())},
    }


# -- served path alone ------------------------------------------------------------------------


def served(nodes: int, seconds: float, batch: int, warmup: int) -> dict[str, Any]:
    """`GNNScheduler.place` on batches of `batch` real decision points at `nodes` nodes."""
    from dataclasses import replace

    from dagsched.policy.bundle import load_bundle
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import make_policy, stream_workflows
    from dagsched.sim.view import cluster_view, task_view

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
    sched.place(view, tasks)  # warm-up
    net = sched.numpy_net()
    calls, t0 = 0, time.perf_counter()
    while (wall := time.perf_counter() - t0) < seconds or calls < 2:
        if net is not None:  # every batch encodes its DAGs, as new workflow states would
            net.encodings.clear()
        sched.place(view, tasks)
        calls += 1
    import torch

    return {
        "nodes": view.n,
        "batch": len(tasks),
        "torch_threads": torch.get_num_threads(),
        "calls": calls,
        "per_s": calls * len(tasks) / wall,
        "ms_per_batch": wall / calls * 1000,
    }


# -- the run ----------------------------------------------------------------------------------


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from dagsched.registry.store import Registry

    wall0 = time.monotonic()
    load0 = os.getloadavg()
    doc: dict[str, Any] = {"configs": {}}
    async with local_stack(
        "redis://127.0.0.1:1/0", name="throughput", say=console.log, private_redis=True
    ) as stack:
        s = stack.settings
        registered = False
        if any(c.startswith("gnn") for c in args.configs):
            version = await asyncio.to_thread(Registry(s).ensure_champion)
            registered = version is not None
            console.log(f"registry: champion v{version} (the shipped bundle)")
        bench = Bench(args, console)
        for name in args.configs:
            doc["configs"][name] = await bench.config(name, s, registered)
    # the served path runs with the daemon's torch threads, as in a daemon process
    threads = getattr(stack.settings.daemon, "torch_threads", 0)
    if threads:
        import torch

        torch.set_num_threads(threads)
    served_rows = []
    for n in args.served_nodes:
        with console.status(f"served path at {n} nodes"):
            row = await asyncio.to_thread(served, n, args.served_s, 64, args.served_warmup)
        console.log(f"served path, {row['nodes']} nodes: {row['per_s']:,.0f} decisions/s")
        served_rows.append(row)
    doc["served"] = served_rows
    doc["setup"] = {
        "quick": args.quick,
        "backlog": args.backlog,
        "pace_s": args.pace_s,
        "rates": list(RATES),
        "torch_threads": args.torch_threads,
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


def _rate(doc: dict[str, Any], name: str) -> float | None:
    c = doc["configs"].get(name)
    return None if c is None else c.get("saturation", {}).get("per_s")


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers and which targets they meet."""
    out: dict[str, Any] = {
        "passthrough_per_s": _rate(doc, "passthrough"),
        "heuristic_per_s": _rate(doc, "heuristic"),
        "gnn_per_s": _rate(doc, "gnn"),
        "gnn_2_replicas_per_s": _rate(doc, "gnn2"),
    }
    lat = doc["configs"].get("gnn", {}).get("latency", {})
    for rate in RATES:
        out[f"p50_ms_at_{rate}"] = lat.get(str(rate), {}).get("p50_ms")
        out[f"p99_ms_at_{rate}"] = lat.get(str(rate), {}).get("p99_ms")
    for row in doc["served"]:
        out[f"served_per_s_{row['nodes']}_nodes"] = row["per_s"]
    red = doc["configs"].get("gnn", {}).get("redis") or doc["configs"].get("heuristic", {}).get(
        "redis"
    )
    out["redis_bytes_per_decision"] = red["bytes_per_decision"] if red else None
    best = max((x for x in (out["gnn_per_s"], out["gnn_2_replicas_per_s"]) if x), default=None)
    ratio = best / out["passthrough_per_s"] if best and out["passthrough_per_s"] else None
    out["gnn_vs_passthrough"] = ratio
    checks = {
        "gnn_per_s": best,
        "gnn_vs_passthrough": ratio,
        "p99_ms_at_1000": out["p99_ms_at_1000"],
        "p99_ms_at_5000": out["p99_ms_at_5000"],
        "served_per_s_32_nodes": out.get("served_per_s_32_nodes"),
        "served_per_s_2048_nodes": out.get("served_per_s_2048_nodes"),
    }
    out["targets_met"] = {
        k: None if v is None else bool(v <= TARGETS[k] if k.startswith("p99") else v >= TARGETS[k])
        for k, v in checks.items()
    }
    return out


def _fmt_rate(sat: dict[str, Any]) -> str:
    if "per_s" not in sat:
        return f"{sat['decided']} decided"
    return f"{sat['per_s']:,.0f}/s ({sat['per_s_all']:,.0f}/s all-in, {sat['decided']:,} decided)"


def _n(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.0f}{unit}" if abs(x) >= 100 else f"{x:,.1f}{unit}"


def show(doc: dict[str, Any], console: Console) -> None:
    """The tables: configurations, latency, served path, Redis, targets."""
    t = Table(title="Daemon throughput: decisions/s at saturation (backlog published first)")
    for col in ("config", "replicas", "decisions/s", "all-in/s", "decided", "arms", "Redis B/dec"):
        t.add_column(col, justify="right")
    for name, c in doc["configs"].items():
        sat = c.get("saturation", {})
        red = c.get("redis")
        t.add_row(
            name, str(c["replicas"]), _n(sat.get("per_s")), _n(sat.get("per_s_all")),
            f"{sat.get('decided', 0):,} / {c['backlog_tasks']:,}",
            ", ".join(f"{k} {v:,}" for k, v in sorted(sat.get("arms", {}).items())),
            _n(red["bytes_per_decision"]) if red else "-",
        )  # fmt: skip
    console.print(t)
    lt = Table(title="Submit-to-decision latency (ms) at offered tasks/s: p50 / p99")
    lt.add_column("config")
    for rate in RATES:
        lt.add_column(f"{rate:,}/s", justify="right")
    for name, c in doc["configs"].items():
        if "latency" in c:
            cells = []
            for rate in RATES:
                r = c["latency"][str(rate)]
                tail = "" if r["complete"] else f" ({r['decided']:,}/{r['tasks']:,})"
                cells.append(f"{_n(r['p50_ms'])} / {_n(r['p99_ms'])}{tail}")
            lt.add_row(name, *cells)
    console.print(lt)
    st = Table(title="Served path alone: GNNScheduler.place, batches of 64")
    for col in ("nodes", "decisions/s", "ms per batch"):
        st.add_column(col, justify="right")
    for r in doc["served"]:
        st.add_row(str(r["nodes"]), _n(r["per_s"]), f"{r['ms_per_batch']:.1f}")
    console.print(st)
    for name, c in doc["configs"].items():
        red = c.get("redis")
        if not red:
            continue
        rt = Table(title=f"Redis after the backlog, {name}: bytes per decision by key family")
        for col in ("family", "keys", "bytes", "bytes/decision"):
            rt.add_column(col, justify="right")
        for fam, v in red["families"].items():
            rt.add_row(fam, f"{v['keys']:,}", f"{v['bytes']:,}", _n(v["bytes"] / red["decisions"]))
        rt.add_row("all", f"{red['keys']:,}", f"{red['bytes']:,}", _n(red["bytes_per_decision"]))
        console.print(rt)
    sm = doc["summary"]
    tt = Table(title="Targets (issue 13)")
    for col in ("measure", "value", "target", "met"):
        tt.add_column(col, justify="right")
    for k, target in TARGETS.items():
        v = sm.get(k)
        if k == "gnn_per_s":
            v = max((x for x in (sm["gnn_per_s"], sm["gnn_2_replicas_per_s"]) if x), default=None)
        met = {True: "yes", False: "no"}.get(sm["targets_met"].get(k), "-")
        op = "<=" if k.startswith("p99") else ">="
        tt.add_row(k, "-" if v is None else f"{v:,.2f}", f"{op} {target:,g}", met)
    console.print(tt)
    su = doc["setup"]
    console.print(
        f"load average (1/5/15 min) at start {su['load_avg_start'][0]:.2f} / "
        f"{su['load_avg_start'][1]:.2f} / {su['load_avg_start'][2]:.2f}, at end "
        f"{su['load_avg_end'][0]:.2f}; {su['cpus']} CPUs; wall {doc['wall_s']:.0f} s"
    )


def main() -> None:
    """Parse the options, run, print the tables, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller run (under 3 minutes)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--latency-configs", default="passthrough,heuristic,gnn")
    ap.add_argument("--backlog", type=int, default=None, help="tasks (default 20000; quick 3000)")
    ap.add_argument("--pace-s", type=float, default=None, help="seconds per offered rate")
    ap.add_argument("--served-nodes", default=",".join(map(str, SERVED_NODES)))
    ap.add_argument("--torch-threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.configs = [c for c in args.configs.split(",") if c]
    args.latency_configs = set(args.latency_configs.split(","))
    args.served_nodes = [int(n) for n in args.served_nodes.split(",") if n]
    if args.quick:
        args.backlog = args.backlog or 3000
        args.pace_s = args.pace_s or 1.0
        args.latency_configs &= {"gnn"}
        args.served_s, args.served_warmup = 1.0, 30
        args.backlog_timeout, args.drain_timeout = 60.0, 30.0
    else:
        args.backlog = args.backlog or 20_000
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
