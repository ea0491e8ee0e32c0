"""Does the served cluster drift from the simulator's under the same version and workload?

A real-path run of `shift` had its observed window mean JCT climb (765 s to 2,372 s over 14
windows) while the in-process loop's windows of the same seed stayed at 750-1,070 s. This
plays one version both ways, with nothing learning or judging: served (embedded broker,
Redis, one daemon replica serving the version, the simulator asking it over Kafka) and in
the simulator's own process, on the same workload, shift and seed, and prints the mean JCT
of each window of `--window` arrivals side by side. At the end of the served run it reads
the daemon's reservation ledger in Redis once its updater has applied every event: queued
and running attempts, and per node kind the free cores and memory it holds.

    .venv/bin/python experiments/served_drift.py [--workflows 1400] [--seed 0]
        [--shift-at 0.1] [--window 100] [--moved mem=0.2] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dagsched.core.view import NODE_KINDS
from dagsched.core.workflow import Workflow
from dagsched.daemon.broker import embedded_broker
from dagsched.daemon.redis_state import RedisState, connect
from dagsched.daemon.replay import Replay, ReplayConfig
from dagsched.daemon.service import Daemon
from dagsched.demo import arrival_at, demo_shift
from dagsched.learner.head_search import with_shifts
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.registry.store import SHIPPED_CHAMPION
from dagsched.settings import Settings, load_settings
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import WorkflowEnds
from dagsched.sim.runner import stream_workflows
from dagsched.sim.snapshot import SchedulerPolicy

console = Console()


def version(moved: dict[str, float]) -> GNNScheduler:
    """The shipped champion, its heads' shifts moved by `moved` (none: as shipped)."""
    champion = load_bundle(SHIPPED_CHAMPION, "v1")
    return GNNScheduler(with_shifts(champion.model, moved), champion.normalizer, "v1")


COUNTS = ("oom_kills", "task_failures", "workflows_failed", "node_failures")


@dataclass
class Played:
    """One way of playing the run: (arrival, JCT) per workflow that ended, in arrival order;
    the run's fault counts; and what else was read of it."""

    rows: list[tuple[float, float]]
    counts: dict[str, float]
    extra: dict[str, Any] = field(default_factory=dict)


def workload(s: Settings, seed: int, n: int) -> list[Workflow]:
    """The workflows both ways play: those `dagsched sim replay` streams for `seed`."""
    return list(stream_workflows(s.sim, seed, n))


def in_process(s: Settings, bundle: GNNScheduler, seed: int, n: int) -> Played:
    """The run in the simulator's own process."""
    wfs = workload(s, seed, n)
    ends = WorkflowEnds(frozenset(w.id for w in wfs))
    sim = Simulator(s.sim, wfs, seed=seed, on_outcome=ends)
    ends.sim = sim
    out = sim.run(SchedulerPolicy(bundle, "in process"))
    arrival = {w.id: w.arrival_s for w in wfs}
    rows = sorted((arrival[i], j) for i, j in ends.result.jct_s.items())
    return Played(rows, {k: float(out[k]) for k in COUNTS})


async def served(s: Settings, bundle: GNNScheduler, seed: int, n: int) -> Played:
    """The run served by one daemon replica over the embedded broker; with the daemon's
    ledger once its updater has applied every event."""
    async with embedded_broker(s) as broker:
        s = s.model_copy(update={"kafka_bootstrap": broker.bootstrap})
        daemon = Daemon(
            s,
            loader=lambda _s, arm: ("v1", bundle) if arm == "champion" else None,
            version_of=lambda _s, arm: "v1" if arm == "champion" else None,
        )
        task = asyncio.create_task(daemon.async_run())
        while daemon.models.version("champion") is None:
            if task.done():
                await task
            await asyncio.sleep(0.2)  # polling a load that runs in a worker thread
        replay = Replay(s, ReplayConfig(workflows=n, seed=seed))
        t0 = time.monotonic()
        with Progress(console=console) as bar:
            job = bar.add_task("served", total=n)
            replay.progress = lambda k, _n: bar.update(job, completed=k)
            result = await replay.run()
        wall_s = time.monotonic() - t0
        assert daemon.updater is not None
        while daemon.updater.applied < result["events_sent"]:
            await asyncio.sleep(0.2)  # polling the updater's counter: it runs in this loop
        ledger = await read_ledger(s)
        daemon.stop()
        await asyncio.wait_for(task, 60)
    rows = sorted(
        (o.arrival_s, o.end_s - o.arrival_s)
        for o in replay.workflow_outcomes()
        if o.end_s is not None
    )
    extra = {"wall_s": wall_s, "stale_views": daemon.stats["stale_views"],
             "decisions": daemon.stats["decisions"], "rejected": result["rejected"],
             "events": result["events_sent"], "ledger_at_end": ledger}  # fmt: skip
    return Played(rows, {k: float(result[k]) for k in COUNTS}, extra)


async def read_ledger(s: Settings) -> dict[str, Any]:
    rds = connect(s)
    try:
        view = await RedisState(rds, s).cluster_view()
    finally:
        await rds.aclose()
    kinds: dict[str, Any] = {}
    for k, name in enumerate(NODE_KINDS):
        on = view.kind == k
        if not on.any():
            continue
        kinds[name] = {
            "nodes": int(on.sum()),
            "queued": int(view.queue_len[on].sum()),
            "free_cores": float(view.free_cores[on].sum()),
            "cores": float(view.cores[on].sum()),
            "free_mem_gb": float(view.free_mem[on].sum()),
            "mem_gb": float(view.mem_gb[on].sum()),
            "running": int(np.isin(view.running.node, np.flatnonzero(on)).sum())
            if view.running is not None
            else 0,
        }
    return {"by_kind": kinds}


def overrides() -> dict[str, str]:
    """The DAGSCHED_* variables this run was given."""
    return {k: v for k, v in os.environ.items() if k.startswith("DAGSCHED_")}


def windows(rows: list[tuple[float, float]], arrivals: list[float], size: int) -> list[float]:
    """Mean JCT of the workflows that arrived in each window of `size` arrivals."""
    edges = [arrivals[i] for i in range(0, len(arrivals), size)] + [float("inf")]
    out = []
    for lo, hi in itertools.pairwise(edges):
        got = [j for a, j in rows if lo <= a < hi]
        out.append(float(np.mean(got)) if got else float("nan"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workflows", type=int, default=1400)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shift-at", type=float, default=0.1)
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--moved", default="", help="e.g. mem=0.2: the champion's head shifts moved")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    moved = {k: float(v) for k, v in (p.split("=") for p in args.moved.split(",") if p)}
    s = load_settings("shift", {"log_level": "WARNING", "daemon.metrics_port": 0,
                                "topic_prefix": f"drift-{uuid.uuid4().hex[:8]}-"})  # fmt: skip
    # DAGSCHED_* variables apply (e.g. DAGSCHED_DAEMON__VIEW_WAIT_MS) and are recorded
    n = args.workflows
    shift = demo_shift(s, arrival_at(s, n, args.seed, args.shift_at))
    workload = replace(s.sim.workload, workflows=n)
    s = s.model_copy(update={"sim": replace(s.sim, shift=shift, workload=workload)})
    t0 = time.monotonic()
    here = in_process(s, version(moved), args.seed, n)
    console.print(f"in process: {len(here.rows)} ended in {time.monotonic() - t0:.0f} s")
    there = asyncio.run(served(s, version(moved), args.seed, n))
    console.print(f"served: {len(there.rows)} ended in {there.extra['wall_s']:.0f} s")
    arrivals = [w.arrival_s for w in workload(s, args.seed, n)]
    w_here = windows(here.rows, arrivals, args.window)
    w_there = windows(there.rows, arrivals, args.window)
    table = Table(title=f"mean JCT per {args.window} arrivals, shift seed {args.seed}"
                  f" ({args.moved or 'champion'})")  # fmt: skip
    for col in ("window", "in process s", "served s", "served / in process"):
        table.add_column(col, justify="right")
    for i, (a, b) in enumerate(zip(w_here, w_there, strict=True)):
        table.add_row(str(i), f"{a:,.0f}", f"{b:,.0f}", f"{b / a:.2f}")
    console.print(table)
    console.print({"in process": here.counts, "served": there.counts})
    console.print({k: v for k, v in there.extra.items() if k != "ledger_at_end"})
    if args.out:
        got = {"in_process": {"windows": w_here, **asdict(here)},
               "served": {"windows": w_there, **asdict(there)}}  # fmt: skip
        for played in got.values():
            del played["rows"]
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "settings_env": overrides(), **got}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
