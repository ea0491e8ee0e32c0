"""Inference speed: decisions per second of the shipped champion on CPU, for batches of 1, 16
and 256 tasks on the default 32-node cluster.

Three paths, all from raw observations to placements (normalise, collate, forward, act):
- `batched`: one forward pass for the whole batch (`place_observations`), the model's
  throughput, and what the issue's target (>= 5,000 decisions/s at batch 256) is about;
- `compiled`: the same with `GNNScheduler.compile()` (torch.compile); its one-off compile
  time is measured separately and reported;
- `served`: `GNNScheduler.place` as the daemon calls it, which places a batch in order, one
  forward pass per task, each seeing the earlier placements (observation included).

Decision points are real: the default scenario played by least-loaded, one task per batch
until there are enough. Model loading and imports are excluded. Prints a table and writes
JSON (default bench/results/inference_speed.json).

    .venv/bin/python bench/inference_speed.py [--batches 1,16,256] [--seconds 3] [--threads 0]
        [--no-compile]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from harness.results import write_results
from rich.console import Console
from rich.table import Table

from dagsched.core.observation import Observation, observe
from dagsched.core.view import ClusterView, TaskView
from dagsched.policy.bundle import load_bundle
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view

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
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile path")
    ap.add_argument("--out", type=Path, default=Path("bench/results/inference_speed.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    sizes = [int(b) for b in args.batches.split(",")]
    points = decision_points(max(sizes))
    raws: dict[int, list[Observation]] = {
        b: [observe(cv, tv) for cv, tv in points[:b]] for b in sizes
    }
    eager = load_bundle(REPO / "models" / "champion", "bench")
    compiled, compile_s = None, None
    if not args.no_compile:
        compiled = load_bundle(REPO / "models" / "champion", "bench").compile()
        t0 = time.perf_counter()
        for raw in raws.values():  # one compile per shape family, out of the timings
            compiled.place_observations(raw)
        compile_s = time.perf_counter() - t0

    rows = []
    for b in sizes:
        raw = raws[b]
        cluster, tasks = points[b - 1][0], [tv for _, tv in points[:b]]
        row: dict[str, Any] = {"batch": b}
        cases: list[tuple[str, Callable[[], Any]]] = [
            ("batched", lambda raw=raw: eager.place_observations(raw)),
            ("served", lambda c=cluster, t=tasks: eager.place(c, t)),
        ]
        if compiled is not None:
            cases.insert(1, ("compiled", lambda raw=raw: compiled.place_observations(raw)))
        for name, run in cases:
            r = rate(run, b, args.seconds)
            row[f"{name}_decisions_per_s"] = r["decisions_per_s"]
            row[f"{name}_ms_per_batch"] = r["ms_per_batch"]
        rows.append(row)

    console = Console()
    t = Table(title="Champion inference on CPU (32 nodes): decisions/s (ms per batch)")
    names = [n for n in ("batched", "compiled", "served") if f"{n}_decisions_per_s" in rows[0]]
    for col in ("batch", *names):
        t.add_column(col, justify="right")
    for r in rows:
        cells = [f"{r[f'{n}_decisions_per_s']:,.0f} ({r[f'{n}_ms_per_batch']:.1f})" for n in names]
        t.add_row(str(r["batch"]), *cells)
    console.print(t)
    if compile_s is not None:
        console.print(f"torch.compile: {compile_s:.1f} s for the first call of each batch size")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "inference_speed",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "model": "models/champion",
        "compile_s": compile_s,
        "rows": rows,
    }
    write_results(args.out, result)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
