"""Inference speed: decisions per second of the shipped champion on CPU, for batches of 1, 16
and 256 tasks on the default 32-node cluster.

Two paths, both from raw observations to placements (normalise, collate, forward, act):
- `batched`: one forward pass for the whole batch (`place_observations`), the model's
  throughput, and what the issue's target (>= 5,000 decisions/s at batch 256) is about;
- `served`: `GNNScheduler.place` as the daemon calls it, which places a batch in order, one
  forward pass per task, each seeing the earlier placements (observation included).

Decision points are real: the default scenario played by least-loaded, one task per batch
until there are enough. Model loading and imports are excluded. Prints a table and writes
JSON (default bench/results/inference_speed.json).

    .venv/bin/python bench/inference_speed.py [--batches 1,16,256] [--seconds 3] [--threads 0]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from dagsched.policy.bundle import load_bundle
from dagsched.policy.features import Observation, observe
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.view import ClusterView, TaskView, cluster_view, task_view

REPO = Path(__file__).resolve().parents[1]


def decision_points(n: int, seed: int = 0) -> list[tuple[ClusterView, TaskView]]:
    """`n` (cluster, task) pairs from the default scenario played by least-loaded."""
    sc = ScenarioConfig()
    sim = Simulator(sc, stream_workflows(sc, seed, 10_000), seed=seed)
    policy = make_policy("least_loaded", seed)
    out: list[tuple[ClusterView, TaskView]] = []
    while len(out) < n and (batch := sim.advance()) is not None:
        out.append((cluster_view(sim), task_view(batch[0])))
        sim.apply(policy.decide(sim, batch), batch)
    return out


def rate(run: Callable[[], Any], decisions: int, seconds: float) -> dict[str, float]:
    """Calls `run` (one batch of `decisions`) for about `seconds` after one warm-up call."""
    run()
    calls, t0 = 0, time.perf_counter()
    while (wall := time.perf_counter() - t0) < seconds or calls < 3:
        run()
        calls += 1
    return {"decisions_per_s": calls * decisions / wall, "ms_per_batch": wall / calls * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,256")
    ap.add_argument("--seconds", type=float, default=3.0, help="timed seconds per case")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--out", type=Path, default=Path("bench/results/inference_speed.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    sizes = [int(b) for b in args.batches.split(",")]
    points = decision_points(max(sizes))
    sched = load_bundle(REPO / "models" / "champion", "bench")
    rows = []
    for b in sizes:
        raw: list[Observation] = [observe(cv, tv) for cv, tv in points[:b]]
        cluster, tasks = points[b - 1][0], [tv for _, tv in points[:b]]
        batched = rate(lambda raw=raw: sched.place_observations(raw), b, args.seconds)
        served = rate(lambda c=cluster, t=tasks: sched.place(c, t), b, args.seconds)
        rows.append(
            {
                "batch": b,
                "batched_decisions_per_s": batched["decisions_per_s"],
                "batched_ms_per_batch": batched["ms_per_batch"],
                "served_decisions_per_s": served["decisions_per_s"],
                "served_ms_per_batch": served["ms_per_batch"],
            }
        )

    console = Console()
    t = Table(title="Champion inference on CPU (32 nodes)")
    for col in ("batch", "batched dec/s", "batched ms", "served dec/s", "served ms"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["batch"]),
            f"{r['batched_decisions_per_s']:,.0f}",
            f"{r['batched_ms_per_batch']:.1f}",
            f"{r['served_decisions_per_s']:,.0f}",
            f"{r['served_ms_per_batch']:.1f}",
        )
    console.print(t)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "inference_speed",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "model": "models/champion",
        "rows": rows,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
