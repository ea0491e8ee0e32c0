"""Simulator speed: task placements per wall second with least-loaded, faults on.

Runs the default scenario's node mix scaled to 32, 256 and 2,048 nodes on one core, then a
longer run at 32 nodes under tracemalloc (heft_history) to show memory stays flat as the run
grows.
Prints a table and writes JSON (default bench/results/sim_speed.json).

    .venv/bin/python bench/sim_speed.py [--workflows 1000] [--nodes 32,256,2048] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows


def speed(nodes: int, workflows: int, repeats: int, seed: int = 0) -> dict[str, Any]:
    """Placements per wall second at one cluster size (workload generation excluded): the
    median of `repeats` identical runs, since a shared machine's timings swing by ~20%."""
    base = ScenarioConfig()
    sc = replace(base, cluster=base.cluster.scaled(nodes))
    wfs = list(stream_workflows(sc, seed, workflows))
    walls, m = [], {}
    for _ in range(repeats):
        sim = Simulator(sc, wfs, seed=seed)
        t0 = time.perf_counter()
        m = sim.run(make_policy("least_loaded", seed))
        walls.append(time.perf_counter() - t0)
    rates = sorted(m["decisions"] / w for w in walls)
    return {
        "nodes": sc.cluster.n_nodes,
        "workflows": workflows,
        "placements": m["decisions"],
        "repeats": repeats,
        "wall_s": statistics.median(walls),
        "placements_per_s": statistics.median(rates),
        "placements_per_s_min": rates[0],
        "placements_per_s_max": rates[-1],
        "node_failures": m["node_failures"],
        "task_failures": m["task_failures"],
    }


def memory(workflows: int, checkpoints: int = 4, seed: int = 0) -> list[dict[str, float]]:
    """Traced Python memory at evenly spaced points of one long streaming run at 32 nodes,
    under heft_history: a policy that keeps up with the default load, so that what grows is
    the simulator's, not a backlog (least-loaded falls ever further behind at load 0.8 in
    the faithful world, and its waiting workflows are real memory)."""
    sc = ScenarioConfig()
    marks = [round(workflows * (i + 1) / checkpoints) for i in range(checkpoints)]
    samples: list[dict[str, float]] = []

    def probe(done: int) -> None:
        if marks and done >= marks[0]:
            marks.pop(0)
            current, _ = tracemalloc.get_traced_memory()
            samples.append({"workflows_done": done, "traced_mib": current / 2**20})

    tracemalloc.start()
    sim = Simulator(sc, stream_workflows(sc, seed, workflows), seed=seed)
    sim.run(make_policy("heft_history", seed), progress=probe)
    tracemalloc.stop()
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=1000)
    ap.add_argument("--nodes", default="32,256,2048")
    ap.add_argument("--repeats", type=int, default=3, help="runs per size; the median is shown")
    ap.add_argument("--memory-workflows", type=int, default=4000)
    ap.add_argument("--out", type=Path, default=Path("bench/results/sim_speed.json"))
    args = ap.parse_args()

    rows = [speed(int(n), args.workflows, args.repeats) for n in args.nodes.split(",")]
    mem = memory(args.memory_workflows)

    console = Console()
    t = Table(title="Simulator speed (least_loaded, faults on, one core; median of repeats)")
    for col in ("nodes", "workflows", "placements", "wall s", "placements/s", "min - max"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(
            str(r["nodes"]),
            str(r["workflows"]),
            str(r["placements"]),
            f"{r['wall_s']:.2f}",
            f"{r['placements_per_s']:,.0f}",
            f"{r['placements_per_s_min']:,.0f} - {r['placements_per_s_max']:,.0f}",
        )
    console.print(t)
    m = Table(title="Traced memory over one long run (32 nodes)")
    m.add_column("workflows done", justify="right")
    m.add_column("traced MiB", justify="right")
    for s in mem:
        m.add_row(str(s["workflows_done"]), f"{s['traced_mib']:.2f}")
    console.print(m)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "bench": "sim_speed",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "speed": rows,
        "memory": mem,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
