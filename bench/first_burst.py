"""First burst after a start and after a hot reload: how much slower than warm is it?

Setup, all on this machine: the embedded Tansu broker, a private `redis-server`, an MLflow
SQLite registry in a temporary home holding the shipped champion as `v1` and, for the reload,
`v2` (the same bundle, its continuous head perturbed by N(0, 0.01) noise), and the default
32-node cluster written into Redis as heartbeats. One `dagsched daemon` process, started the
way a user starts it (`python -m dagsched.cli.main daemon`, code defaults and
configs/default.yaml, JSON logs on stderr).

Sequence:
1. start the daemon; publish the first burst as soon as `/healthz` answers 200, as a deploy's
   traffic would: whatever the daemon has not done by then (loading the model, warming,
   joining its consumer group) is in the first burst's time. The group join (~2-6 s on this
   broker) is not decision time: where the daemon's first assignment (its log) comes after
   the burst was published, the rate is also given from that moment ("/s after join");
2. burst "start, first": `--tasks` ready tasks (every task of the default scenario's
   workflows, about 25 each, so 5,000 tasks are ~200 workflows; shuffled across workflows),
   their workflow messages first, published back to back with confluent-kafka; timed from the
   first record handed to the producer to the last decision read back from
   `dagsched.decisions` (a reader thread stamps each arrival);
3. burst "start, warm": the same workflows again under fresh ids;
4. promote `v2` (`Promoter.promote` with the Redis notice, as `dagsched model promote` does);
   wait until `/healthz` names `v2` as the champion; bursts "reload, first" and "reload, warm"
   as 2 and 3.

Each burst's decisions are counted by arm and version ("served by": the champion's expected
version, or the heuristic where the model did not serve). Ratio = warm rate / first rate; the
target is at most 1.5. On a machine shared with other jobs decisions/s moves with their load,
so the daemon's CPU seconds per burst (its process, all threads) are given too, and their
ratio first / warm.

    PYTHONPATH=. .venv/bin/python bench/first_burst.py [--quick] [--json] [--tasks 5000]

Prints a table (stderr with `--json`), writes `bench/results/first_burst.json`
(`--quick`: `first_burst_quick.json`); `--json` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from harness.in_process import prepare
from harness.kafka_io import Reader, producer, publish, workload
from harness.replicas import Replica, start_replica, stop_replica, wait_until
from harness.stack import REPO, git_state, local_stack
from harness.throughput_report import cpu_seconds
from rich.console import Console
from rich.table import Table

from dagsched.settings import Settings

TARGET_RATIO = 1.5


async def healthz(port: int) -> tuple[int, dict[str, Any]]:
    """`GET /healthz`: the status code and the document ({} when it is not JSON)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n")
        await writer.drain()
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        doc = json.loads(body)
    except ValueError:
        doc = {}
    return int(head.split()[1]), doc


async def poll_healthz(r: Replica, want: Any, timeout: float, what: str) -> float:
    """Poll `/healthz` every 20 ms until `want(status, doc)`; the `time.time()` it first held."""
    deadline = time.monotonic() + timeout
    while True:
        if r.proc.returncode is not None:
            raise RuntimeError(f"the daemon exited ({r.proc.returncode}): {r.log_path}")
        if r.metrics_port is not None:
            with contextlib.suppress(OSError):
                status, doc = await healthz(r.metrics_port)
                if want(status, doc):
                    return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)


def register_v2(s: Settings) -> tuple[Any, str, str]:
    """(registry, v1 = the shipped champion, v2 = it with its continuous head perturbed)."""
    import torch

    from dagsched.policy.bundle import load_bundle, save_bundle
    from dagsched.registry.promotion import audit_experiment
    from dagsched.registry.store import SHIPPED_CHAMPION, Registry

    reg = Registry(s)
    v1 = reg.ensure_champion()
    assert v1 is not None, "the shipped champion did not register"
    audit_experiment(reg)
    sched = load_bundle(SHIPPED_CHAMPION, "shipped", smoke=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sched.model.cont_head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    folder = s.home / "bundle-v2"
    save_bundle(folder, sched.model, sched.normalizer)
    with reg.run("first-burst-v2", {"source": "shipped + N(0, 0.01) on cont_head"}) as run:
        v2 = reg.register_bundle(
            folder,
            run.run_id,
            metrics={},
            parent=v1,
            data="bench/first_burst.py: perturbed shipped champion",
            first_is_champion=False,
        )
    return reg, v1, v2


def _renamed(value: bytes, old: str, new: str) -> bytes:
    """A message with its (first) quoted workflow id `old` replaced by `new`."""
    return value.replace(f'"{old}"'.encode(), f'"{new}"'.encode(), 1)


class Bursts:
    """Publishes bursts and times them against the reader of `dagsched.decisions`."""

    def __init__(self, s: Settings, args: argparse.Namespace, console: Console) -> None:
        self.s = s
        self.args = args
        self.console = console
        self.p = producer(s)
        self.reader = Reader(s)
        self.wfs, self.ready = workload(args.tasks, "proto", seed=args.seed)
        self.rows: list[dict[str, Any]] = []

    async def burst(self, phase: str, which: str, version: str, r: Replica) -> dict[str, Any]:
        """Publish the workload under fresh ids; time until every task has its decision."""
        tag = f"{phase}-{which}"
        rename = {wf_id: f"{tag}-{wf_id}" for wf_id, _ in self.wfs}
        wfs = [(rename[w], _renamed(v, w, rename[w])) for w, v in self.wfs]
        items = [(rename[w], _renamed(v, w, rename[w])) for _, w, v in self.ready]
        keys = [(rename[k[0]], k[1], k[2]) for k, _, _ in self.ready]
        cpu0 = cpu_seconds(r.proc.pid)
        t0 = time.time()
        await asyncio.to_thread(publish, self.p, self.s.topic("tasks"), wfs + items)
        published = time.time() - t0
        arrived = self.reader.arrived
        await wait_until(
            lambda: all(k in arrived for k in keys), self.args.timeout, f"burst {tag}", [r]
        )
        cpu1 = cpu_seconds(r.proc.pid)
        times = [arrived[k][0] - t0 for k in keys]
        # the consumer's first assignment, when it came after the burst was published: the
        # group join is not decision time, so the rate is also given from that moment
        joined = max(0.0, r.assignments[0][0] - t0) if r.assignments else 0.0
        served = Counter(
            f"{arrived[k][1]}:{json.loads(self.reader.raw[k])['model_version']}" for k in keys
        )
        row = {
            "phase": phase,
            "burst": which,
            "version": version,
            "tasks": len(keys),
            "workflows": len(wfs),
            "published_s": published,
            "first_decision_s": min(times),
            "last_decision_s": max(times),
            "per_s": len(keys) / max(times),
            "join_in_burst_s": joined,
            "per_s_after_join": len(keys) / (max(times) - joined),
            # the daemon's CPU time over the burst: steadier than decisions/s where other jobs
            # share the cores (includes its other threads: a reload's registry work, say)
            "cpu_s": cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None,
            "served_by": dict(served),
            "expected": f"champion:{version}",
        }
        self.rows.append(row)
        self.console.log(
            f"{phase}, {which}: {len(keys):,} tasks decided in {max(times):.2f} s "
            f"({row['per_s']:,.0f}/s; first decision at {min(times):.3f} s; "
            f"served by {dict(served)})"
        )
        return row

    def close(self) -> None:
        self.reader.close()


def ratios(rows: list[dict[str, Any]], key: str = "per_s") -> dict[str, float]:
    """Per phase: warm / first of `key` (decisions/s), or first / warm of `cpu_s` (the
    daemon's CPU seconds for the burst): above 1, the first burst was the slower."""
    out = {}
    for phase in dict.fromkeys(r["phase"] for r in rows):
        by = {r["burst"]: r[key] for r in rows if r["phase"] == phase}
        if by.get("first") and by.get("warm"):
            out[phase] = by["warm"] / by["first"] if key == "per_s" else by["first"] / by["warm"]
    return out


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from dagsched.registry.promotion import Promoter, redis_notifier
    from dagsched.registry.serving import model_channel

    load0 = os.getloadavg()
    doc: dict[str, Any] = {}
    async with local_stack(
        "redis://127.0.0.1:1/0", name="first-burst", say=console.log, private_redis=True
    ) as stack:
        s = stack.settings
        rds = await prepare(s)
        await rds.aclose()
        reg, v1, v2 = await asyncio.to_thread(register_v2, s)
        console.log(f"registry: champion v{v1} (shipped), v{v2} (perturbed)")
        bursts = Bursts(s, args, console)
        r: Replica | None = None
        try:
            spawned = time.time()
            r = await start_replica(0, s, stack.home, None)
            # the burst goes out as soon as the daemon says it is ready, as a deploy's
            # traffic would: whatever it has not done by then is in the first burst's time
            ready_at = await poll_healthz(r, lambda st, _: st == 200, 180, "/healthz 200")
            assert r.metrics_port is not None
            start = {"healthz_200_s": ready_at - spawned}
            start["warmup_s"] = (await healthz(r.metrics_port))[1].get("warmup_s", {})
            console.log(f"started: /healthz 200 after {start['healthz_200_s']:.1f} s")
            await bursts.burst("start", "first", f"v{v1}", r)
            start.update(
                {
                    "serving_s": (r.swaps[0][0] if r.swaps else float("nan")) - spawned,
                    "assigned_s": r.assignments[0][0] - spawned,
                }
            )
            await bursts.burst("start", "warm", f"v{v1}", r)
            reload: dict[str, Any] = {}
            if not args.no_reload:
                notify = redis_notifier(stack.redis_url, model_channel(s))
                t_promote = time.time()
                await asyncio.to_thread(
                    Promoter(reg, notify=notify).promote, v2, "first-burst bench", "bench", {}
                )
                promoted = time.time()
                serving2 = await poll_healthz(
                    r,
                    lambda st, d: st == 200 and d.get("models", {}).get("champion") == f"v{v2}",
                    120,
                    f"the daemon to serve v{v2}",
                )
                reload = {
                    "promote_s": promoted - t_promote,
                    "to_serving_s": serving2 - promoted,
                    "warmup_s": (await healthz(r.metrics_port))[1].get("warmup_s", {}),
                }
                console.log(f"reload: v{v2} serves {reload['to_serving_s']:.2f} s after promote")
                await bursts.burst("reload", "first", f"v{v2}", r)
                await bursts.burst("reload", "warm", f"v{v2}", r)
        finally:
            bursts.close()
            if r is not None:
                await stop_replica(r)
        doc["start"] = start
        doc["reload"] = reload
        doc["rows"] = bursts.rows
        doc["ratios"] = ratios(bursts.rows)
        doc["cpu_ratios"] = ratios(bursts.rows, "cpu_s")
    doc["setup"] = {
        "quick": args.quick,
        "tasks": args.tasks,
        "seed": args.seed,
        "cpus": os.cpu_count(),
        "load_avg_start": load0,
        "load_avg_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "git": git_state(),
    }
    return doc


def show(doc: dict[str, Any], console: Console) -> None:
    table = Table(title="first burst vs warm, one daemon process (GNN champion)")
    for col in ("phase", "burst", "version", "tasks", "workflows", "first decision", "all in"):
        table.add_column(col, justify="right")
    table.add_column("decisions/s", justify="right")
    table.add_column("join in burst", justify="right")
    table.add_column("/s after join", justify="right")
    table.add_column("warm / first", justify="right")
    table.add_column("daemon CPU", justify="right")
    table.add_column("CPU first / warm", justify="right")
    table.add_column("served by", justify="left")
    ratio, cpu = doc["ratios"], doc["cpu_ratios"]
    for r in doc["rows"]:
        table.add_row(
            r["phase"],
            r["burst"],
            r["version"],
            f"{r['tasks']:,}",
            f"{r['workflows']:,}",
            f"{r['first_decision_s']:.3f} s",
            f"{r['last_decision_s']:.2f} s",
            f"{r['per_s']:,.0f}",
            f"{r['join_in_burst_s']:.2f} s",
            f"{r['per_s_after_join']:,.0f}",
            f"{ratio[r['phase']]:.2f}" if r["burst"] == "warm" and r["phase"] in ratio else "",
            f"{r['cpu_s']:.2f} s" if r["cpu_s"] is not None else "",
            f"{cpu[r['phase']]:.2f}" if r["burst"] == "warm" and r["phase"] in cpu else "",
            ", ".join(f"{k} {v:,}" for k, v in r["served_by"].items()),
        )
    console.print(table)
    st = doc["start"]
    console.print(
        f"start (after the process was spawned): /healthz 200 at {st['healthz_200_s']:.1f} s, "
        f"first assignment at {st['assigned_s']:.1f} s, champion installed at "
        f"{st['serving_s']:.1f} s; warm-up {st['warmup_s']}; target warm/first <= {TARGET_RATIO}"
    )
    if doc["reload"]:
        console.print(f"reload: the new version served {doc['reload']['to_serving_s']:.2f} s "
                      f"after the promotion; warm-up {doc['reload']['warmup_s']}")  # fmt: skip


def main() -> None:
    """Parse the options, run, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2,000 tasks per burst")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per burst (default 5000)")
    ap.add_argument("--seed", type=int, default=1, help="seed of the workload")
    ap.add_argument("--no-reload", action="store_true", help="skip the hot-reload bursts")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per burst at most")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.tasks = args.tasks or (2_000 if args.quick else 5_000)
    name = "first_burst_quick.json" if args.quick else "first_burst.json"
    out = args.out or REPO / "bench" / "results" / name
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    console = Console(stderr=True)
    doc = asyncio.run(run(args, console))
    show(doc, console)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
