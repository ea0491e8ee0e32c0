"""Explain speed: wall time to explain one decision on the default 32-node cluster, on CPU.

Takes a real decision point from the simulator (the default scenario after 150 least-loaded
placement batches: 32 nodes, a DAG of a few dozen tasks), loads the shipped champion bundle
and times `explain_observation` — every target the CLI's table shows (chosen and runner-up
logits, their gap, CPU / memory / retries), plus the per-node heatmap target that `--png`
adds — over repeats, after one warm-up. Model loading, imports and Redis are excluded (the
CLI pays them once per process). Prints a table and writes JSON (default
bench/results/explain_speed.json).

    .venv/bin/python bench/explain_speed.py [--repeats 10] [--steps 32] [--threads 0]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from harness.results import write_results
from rich.console import Console
from rich.table import Table

from dagsched.core.observation import Observation, observe
from dagsched.policy.attribution import explain_observation
from dagsched.policy.bundle import load_bundle
from dagsched.policy.explanation import CORE_TARGETS, DEFAULT_STEPS
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view

REPO = Path(__file__).resolve().parents[1]


def decision_point(warmup: int = 150, seed: int = 0) -> Observation:
    """A busy moment of the default scenario (32 nodes)."""
    sc = ScenarioConfig()
    sim = Simulator(sc, list(stream_workflows(sc, seed, 40)), seed=seed)
    policy = make_policy("least_loaded", seed)
    for _ in range(warmup):
        batch = sim.advance()
        assert batch is not None
        sim.apply(policy.decide(sim, batch), batch)
    batch = sim.advance()
    assert batch is not None
    return observe(cluster_view(sim), task_view(batch[0]))


def time_case(obs: Observation, targets: tuple[str, ...], steps: int, repeats: int) -> dict:
    sched = load_bundle(REPO / "models" / "champion", "bench")
    t0 = time.perf_counter()  # the first call in a process pays one-time allocations
    explain_observation(sched.model, sched.normalizer, obs, targets=targets, n_steps=steps)
    first = time.perf_counter() - t0
    walls, errors = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ex = explain_observation(sched.model, sched.normalizer, obs, targets=targets, n_steps=steps)
        walls.append(time.perf_counter() - t0)
        errors.append(ex.max_error)
    return {
        "targets": len(targets),
        "heatmap": "node_scores" in targets,
        "steps": steps,
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "first_call_s": first,
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "max_completeness_error": max(errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    ap.add_argument(
        "--threads", type=str, default="0", help="Comma-separated torch thread counts (0: default)"
    )
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "explain_speed.json")
    args = ap.parse_args()
    obs = decision_point()
    default_threads = torch.get_num_threads()
    rows = []
    for th in [int(x) for x in args.threads.split(",")]:
        torch.set_num_threads(th or default_threads)
        for targets in (CORE_TARGETS, (*CORE_TARGETS, "node_scores")):
            rows.append(time_case(obs, targets, args.steps, args.repeats))
    table = Table(title=f"explaining one decision: {obs.nodes.shape[0]} nodes, "
                  f"{obs.dag.shape[0]}-task DAG, CPU")  # fmt: skip
    cols = ("targets", "heatmap", "steps", "threads", "first s", "median s", "min s", "max s")
    for col in (*cols, "max err"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["targets"]), "yes" if r["heatmap"] else "no", str(r["steps"]),
            str(r["threads"]), f"{r['first_call_s']:.3f}", f"{r['median_s']:.3f}",
            f"{r['min_s']:.3f}", f"{r['max_s']:.3f}",
            f"{r['max_completeness_error']:.1g}",
        )  # fmt: skip
    Console(width=120).print(table)
    result = {
        "benchmark": "explain_speed",
        "nodes": int(obs.nodes.shape[0]),
        "dag_tasks": int(obs.dag.shape[0]),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.out, result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
