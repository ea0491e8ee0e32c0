"""A map stage's burst through the served path: `--width` ready siblings of one workflow
(a root, `--width` map tasks, a reduce), placed by `GNNScheduler.place` in batches of 64 (the
daemon's `batch_max`) on the default 32-node cluster after a least-loaded warm-up, one torch
and one BLAS thread as in a daemon.

The target: a 2,000-task burst in under half a second. The model's DAG input does not
say which task is placed, so the fast path encodes the stage's workflow once (and keeps the
encoding for the stage's later batches, `NumpyNet.encodings`); the plain path still encodes
one copy per decision (k siblings of a (k + 2)-task DAG: k x (k + 2) task rows).
Writes `bench/results/map_burst.json`.

    PYTHONPATH=. .venv/bin/python bench/map_burst.py [--widths 250,500,1000,2000] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from harness.results import write_results

REPO = Path(__file__).resolve().parents[1]


def burst(width: int, plain_tasks: int) -> dict[str, Any]:
    import torch
    from threadpoolctl import threadpool_limits

    from dagsched.core.view import map_stage
    from dagsched.policy.bundle import load_bundle
    from dagsched.policy.numpy_net import Encodings
    from dagsched.sim.config import ScenarioConfig
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import make_policy, stream_workflows
    from dagsched.sim.snapshot import cluster_view

    torch.set_num_threads(1)
    threadpool_limits(1, user_api="blas")
    sc = ScenarioConfig()
    sim = Simulator(sc, stream_workflows(sc, 0, 100_000), seed=0)
    policy = make_policy("least_loaded", 0)
    for _ in range(200):  # a busy cluster
        b = sim.advance()
        assert b is not None
        sim.apply(policy.decide(sim, b), b)
    view = cluster_view(sim)
    proto = next(iter(stream_workflows(sc, 1, 1))).tasks[0]  # one of the scenario's tasks
    ready = map_stage(proto, width, view.now)
    sched = load_bundle(REPO / "models" / "champion", "bench", smoke=False)
    sched.place(view, ready[:2])  # warm-up
    net = sched.numpy_net()
    if net is not None:  # the burst's first batch encodes its DAG, as in a daemon
        net.encodings = Encodings()
    t0 = time.perf_counter()
    for j in range(0, width, 64):
        sched.place(view, ready[j : j + 64])
    fast_s = time.perf_counter() - t0
    n_plain = min(width, plain_tasks)
    t0 = time.perf_counter()
    for j in range(0, n_plain, 64):
        sched.place_reference(view, ready[j : min(j + 64, n_plain)])
    plain_s = time.perf_counter() - t0
    return {
        "width": width,
        "fast_s": fast_s,
        "fast_per_s": width / fast_s,
        "plain_per_s": n_plain / plain_s,
        "plain_tasks_timed": n_plain,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", default="250,500,1000,2000")
    ap.add_argument("--plain-tasks", type=int, default=128, help="tasks the plain path times")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    load0 = os.getloadavg()
    rows = []
    for w in (int(x) for x in args.widths.split(",") if x):
        row = burst(w, args.plain_tasks)
        rows.append(row)
        print(
            f"{w:>6} siblings: fast path {row['fast_s']:.2f} s ({row['fast_per_s']:,.0f}/s), "
            f"plain path {row['plain_per_s']:,.0f}/s",
            file=sys.stderr,
        )
    doc = {
        "rows": rows,
        "load_avg_start": load0,
        "load_avg_end": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
    }
    out = REPO / "bench" / "results" / "map_burst.json"
    doc = write_results(out, doc)
    if args.json:
        print(json.dumps(doc))


if __name__ == "__main__":
    main()
