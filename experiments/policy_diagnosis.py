"""Policy diagnosis: how loaded "load" really is, and where the champion loses to HEFT.

Two measurements behind the README's account of the policy target:
- utilisation: reserved core-seconds / (cluster cores x arrival span) of HEFT, least-loaded
  and random at loads 0.8 and 0.95 (300 workflows, seed 1000). `sim.workload.load` sets
  arrivals for a type-oblivious placement, so a type-aware scheduler sees far less;
- reservations: the shipped champion, the champion's node choices with HEFT-style
  reservations (exactly the demand, clamped to the bounds), and HEFT, on the default
  scenario and at load 2.0 (held-out seeds), plus the champion's reservation / demand ratios.

Prints two tables and writes JSON (default experiments/results/policy_diagnosis.json).

    .venv/bin/python experiments/policy_diagnosis.py [--seeds 3] [--heavy-workflows 200]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dagsched.core.observation import demand_fractions
from dagsched.learner.offline_eval import HELD_OUT_SEED
from dagsched.policy.bundle import load_bundle
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, simulate, stream_workflows
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import SchedulerPolicy, cluster_view, task_view

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"


def with_load(sc: ScenarioConfig, load: float, workflows: int) -> ScenarioConfig:
    return replace(sc, workload=replace(sc.workload, load=load, workflows=workflows))


def utilisation(loads: tuple[float, ...], workflows: int, seed: int) -> list[dict[str, Any]]:
    rows = []
    for load in loads:
        sc = with_load(ScenarioConfig(), load, workflows)
        wfs = list(stream_workflows(sc, seed, workflows))
        cores = sum(g.cores * g.count for g in sc.cluster.groups)
        span = wfs[-1].arrival_s
        for name in ("heft", "least_loaded", "random"):
            m = Simulator(sc, wfs, seed=seed).run(make_policy(name, seed))
            rows.append(
                {
                    "load": load,
                    "policy": name,
                    "reserved_core_share": m["cost_core_s"] / (cores * span),
                    "sla_attainment": m["sla_attainment"],
                    "mean_jct_s": m["mean_jct_s"],
                }
            )
    return rows


class Recorder(SchedulerPolicy):
    """The model's placements, recording reservation / demand per decision; with
    `demand=True` it keeps the model's node but reserves exactly the (clamped) demand."""

    def __init__(self, scheduler: Any, name: str, demand: bool) -> None:
        super().__init__(scheduler, name)
        self.demand = demand
        self.ratios: list[tuple[float, float]] = []

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        cv = cluster_view(sim)
        placements = self.scheduler.place(cv, [task_view(t) for t in ready])
        out = []
        for t, p in zip(ready, placements, strict=True):
            cpu, mem = demand_fractions(cv, t.spec.cpu_cores, t.spec.mem_gb)
            c, m = float(cpu[p.node]), float(mem[p.node])
            self.ratios.append((p.cpu / c, p.mem / m))
            if self.demand:
                out.append(Decision(t, p.node, c, m, p.max_retries))
            else:
                out.append(Decision(t, p.node, p.cpu, p.mem, p.max_retries))
        return out


def reservations(cases: dict[str, ScenarioConfig], seeds: int) -> list[dict[str, Any]]:
    model = load_bundle(CHAMPION, "champion")
    rows = []
    for case, sc in cases.items():
        for name in ("champion", "champion nodes + demand", "heft"):
            runs, ratios = [], []
            for k in range(seeds):
                seed = HELD_OUT_SEED + k
                pol: Any = "heft"
                if name != "heft":
                    pol = Recorder(model, name, demand=name != "champion")
                runs.append(simulate(sc, pol, seed=seed))
                if name == "champion":
                    ratios += pol.ratios
            row = {
                "scenario": case,
                "policy": name,
                "seeds": seeds,
                "sla_attainment": float(np.mean([r["sla_attainment"] for r in runs])),
                "mean_jct_s": float(np.mean([r["mean_jct_s"] for r in runs])),
            }
            if ratios:
                r = np.array(ratios)
                row["cpu_reserved_over_demand_median"] = float(np.median(r[:, 0]))
                row["mem_reserved_over_demand_median"] = float(np.median(r[:, 1]))
            rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3, help="held-out seeds per scenario")
    ap.add_argument("--workflows", type=int, default=30, help="workflows, default scenario")
    ap.add_argument("--heavy-workflows", type=int, default=200, help="workflows at load 2.0")
    ap.add_argument("--out", type=Path, default=Path("experiments/results/policy_diagnosis.json"))
    args = ap.parse_args()

    util = utilisation((0.8, 0.95), 300, seed=1000)
    base = ScenarioConfig()
    cases = {
        "default": with_load(base, base.workload.load, args.workflows),
        "load:2.0": with_load(base, 2.0, args.heavy_workflows),
    }
    res = reservations(cases, args.seeds)

    console = Console()
    t = Table(title="Reserved share of the cluster's cores (300 workflows, seed 1000)")
    for col in ("load", "policy", "reserved cores", "SLA", "mean JCT s"):
        t.add_column(col, justify="right")
    for r in util:
        t.add_row(
            f"{r['load']:g}",
            r["policy"],
            f"{r['reserved_core_share']:.1%}",
            f"{r['sla_attainment']:.3f}",
            f"{r['mean_jct_s']:.0f}",
        )
    console.print(t)
    t = Table(title=f"The champion's reservations ({args.seeds} held-out seeds)")
    for col in ("scenario", "policy", "SLA", "mean JCT s", "cpu / demand", "mem / demand"):
        t.add_column(col, justify="right")
    for r in res:
        t.add_row(
            r["scenario"],
            r["policy"],
            f"{r['sla_attainment']:.3f}",
            f"{r['mean_jct_s']:.0f}",
            f"{r['cpu_reserved_over_demand_median']:.2f}"
            if "cpu_reserved_over_demand_median" in r
            else "",
            f"{r['mem_reserved_over_demand_median']:.2f}"
            if "mem_reserved_over_demand_median" in r
            else "",
        )
    console.print(t)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "policy_diagnosis", "utilisation": util, "reservations": res}
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
