"""A map stage's burst through the daemon: `--width` ready siblings of one
workflow published at once, from the first `task_ready` handed to the producer to the last
decision read back from `dagsched.decisions`, with the GNN champion serving.

Setup as `experiments/daemon_profile.py` (the embedded broker, a private `redis-server`, the
default 32 nodes as heartbeats) with one `Daemon` in this process serving the shipped
champion (garbage collector frozen after start-up, as the `dagsched daemon` process does;
one torch thread). A warm-up backlog of the default scenario is decided first (the consumer
group's join, the model's first batches). Then, per width: the workflow (a root, the map
tasks, a reduce: `core.view.map_stage`) is published and stored, and its map tasks are
published back to back. `bench/map_burst.py` measures the served path alone on the same
shape.

    PYTHONPATH=. .venv/bin/python bench/daemon_burst.py [--widths 500,2000] [--json]

Writes `bench/results/daemon_burst.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness.in_process import champion_daemon, prepare
from harness.kafka_io import Reader, producer, publish, workload
from harness.stack import local_stack
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
WARMUP_TASKS = 1_000


async def wait_for(done: Any, timeout: float, what: str) -> None:
    """Until `done()`, looking every 50 ms: the reader's thread stamps each decision's arrival
    itself, so a slower look costs no precision and takes little CPU from the daemon."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} within {timeout:.0f} s")
        await asyncio.sleep(0.05)


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    from dagsched.core.view import map_stage
    from dagsched.core.wire import to_message
    from dagsched.daemon.service import set_torch_threads
    from dagsched.schemas.messages import TaskReadyMsg
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.runner import stream_workflows

    rows = []
    async with local_stack("redis://127.0.0.1:1/0", name="burst", private_redis=True) as st:
        s = st.settings
        rds = await prepare(s)
        p = producer(s)
        reader = Reader(s)
        set_torch_threads(s)
        d = champion_daemon(s)
        task = asyncio.create_task(d.async_run())
        try:
            wfs, ready = workload(WARMUP_TASKS, "warm", seed=1)
            await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
            await asyncio.to_thread(publish, p, s.topic("tasks"), [(k, v) for _, k, v in ready])
            keys = [k for k, _, _ in ready]
            await wait_for(lambda: all(k in reader.arrived for k in keys), 300, "warm-up")
            console.log(f"warm-up: {len(keys):,} tasks decided")
            proto = next(iter(stream_workflows(ScenarioConfig(), 1, 1))).tasks[0]
            for width in args.widths:
                wf_id = f"burst-{width}"
                stage = map_stage(proto, width, 0.0)
                msg = to_message(stage[0].workflow).model_copy(update={"workflow_id": wf_id})
                await asyncio.to_thread(publish, p, s.topic("tasks"), [(wf_id, msg.encode())])
                stored = f"{s.topic_prefix}dagsched:wf:{wf_id}"
                deadline = time.monotonic() + 60
                while not await rds.exists(stored):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"workflow {wf_id} not stored")
                    await asyncio.sleep(0.005)
                items = [
                    (wf_id, TaskReadyMsg(workflow_id=wf_id, task=t.idx, attempt=0).encode())
                    for t in stage
                ]
                burst_keys = [(wf_id, t.idx, 0) for t in stage]
                d0 = d.stats["decisions"]
                if args.profile:
                    import cProfile

                    prof = cProfile.Profile()
                    prof.enable()
                t0 = time.time()
                await asyncio.to_thread(publish, p, s.topic("tasks"), items)
                published = time.time() - t0
                await wait_for(
                    lambda ks=burst_keys: all(k in reader.arrived for k in ks), 600, "burst"
                )
                if args.profile:
                    prof.disable()
                    prof.dump_stats(f"{args.profile}.{width}")
                arrivals = np.array([reader.arrived[k][0] - t0 for k in burst_keys])
                row = {
                    "width": width,
                    "published_s": published,
                    "first_decision_s": float(arrivals.min()),
                    "p50_s": float(np.percentile(arrivals, 50)),
                    "last_decision_s": float(arrivals.max()),
                    "per_s": width / float(arrivals.max()),
                    "decisions": d.stats["decisions"] - d0,
                }
                rows.append(row)
                console.log(
                    f"{width:,} siblings: last decision {row['last_decision_s']:.2f} s after the "
                    f"first was handed to the producer ({row['per_s']:,.0f}/s; published in "
                    f"{published:.2f} s)"
                )
        finally:
            d.stop()
            await task
            reader.close()
            await rds.aclose()
    return {
        "rows": rows,
        "load_avg": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="500,2000")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--profile", default=None, help="cProfile each burst to FILE.WIDTH")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "daemon_burst.json")
    args = ap.parse_args()
    args.widths = [int(w) for w in args.widths.split(",") if w]
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    console = Console(stderr=True)
    doc = asyncio.run(run(args, console))
    table = Table(title="a map stage through the daemon (GNN champion)")
    for col in ("siblings", "published in", "first decision", "p50", "last decision", "per s"):
        table.add_column(col, justify="right")
    for r in doc["rows"]:
        table.add_row(
            f"{r['width']:,}",
            f"{r['published_s']:.2f} s",
            f"{r['first_decision_s']:.3f} s",
            f"{r['p50_s']:.2f} s",
            f"{r['last_decision_s']:.2f} s",
            f"{r['per_s']:,.0f}",
        )
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if args.json:
        print(json.dumps(doc))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
