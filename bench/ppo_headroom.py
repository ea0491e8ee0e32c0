"""Where a learned policy could beat heft_history, and where a model loses to it.

Held-out seeds of the default scenario at loads 0.8 and 0.95, as `dagsched eval` draws them:

- oracles: heft_history's placement with every reservation set from the hidden truth (the
  task's real mean CPU use and memory peak x 1.05: no OOM kill, no throttling, no waste),
  then also with the placed task's real run time in the finish-time estimate. Their mean JCT
  bounds what better reservations and runtime predictions can buy;
- with `--model BUNDLE`, the model split in two: its node choices with heft_history's
  reservations, and heft_history's node choices with the model's reservations (as ratios to
  heft_history's on the model's node), which says which head the gap comes from.

    python bench/ppo_headroom.py [--model models/champion] [--seeds 4] [--workflows 60]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.core.history import predicted_use, summarize
from dagsched.core.scheduler import Scheduler
from dagsched.learner.offline_eval import evaluate, scenarios
from dagsched.policy.bundle import load_bundle
from dagsched.sim.baselines import (
    HISTORY_MARGIN,
    BatchView,
    Demand,
    HEFTHistoryPolicy,
    earliest_finish_node,
)
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import SchedulerPolicy, cluster_view, task_view


def history_demand(sim: Simulator, t: TaskRun) -> Demand:
    """heft_history's reservation and runtime prediction for `t`."""
    s = t.spec
    stats = summarize(sim.history.get(s.family))
    cores, mem, ratio = predicted_use(s.cpu_cores, s.mem_gb, stats, HISTORY_MARGIN)
    return Demand(sim, t, cores, mem, ratio)


class Oracle:
    """heft_history's order and finish-time rule with reservations from the hidden truth
    (and, with `runtime`, the task's real run time)."""

    def __init__(self, runtime: bool) -> None:
        self.runtime = runtime
        self.name = "oracle_res_runtime" if runtime else "oracle_res"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        order = sorted(ready, key=lambda t: -t.run.upward_rank()[t.idx])
        view = BatchView(sim)
        out = []
        for t in order:
            ratio = history_demand(sim, t).runtime_ratio
            if self.runtime:
                ratio = t.true_s / t.spec.duration_s
            d = Demand(sim, t, t.use_cores, t.peak_mem * 1.05, ratio)
            node = earliest_finish_node(sim, view, d, t, predicted=True)
            out.append(d.decision(t, node))
            view.take(sim, node, d, t)
        return out


class ModelNodes(SchedulerPolicy):
    """The model's node choices with heft_history's reservations."""

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        ps = self.scheduler.place(cluster_view(sim), [task_view(t, sim) for t in ready])
        return [history_demand(sim, t).decision(t, p.node) for t, p in zip(ready, ps, strict=True)]


class ModelReservations(SchedulerPolicy):
    """heft_history's node choices with the model's reservations, carried over as ratios to
    heft_history's reservation on the node the model chose."""

    def __init__(self, scheduler: Scheduler, name: str) -> None:
        super().__init__(scheduler, name)
        self.hh = HEFTHistoryPolicy()

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        hh = {id(d.task): d for d in self.hh.decide(sim, ready)}
        ps = self.scheduler.place(cluster_view(sim), [task_view(t, sim) for t in ready])
        out = []
        for t, p in zip(ready, ps, strict=True):
            d, ref = hh[id(t)], history_demand(sim, t)
            cpu = d.cpu * p.cpu / ref.frac[0, p.node]
            mem = d.mem * p.mem / ref.frac[1, p.node]
            cpu = min(CPU_BOUNDS[1], max(CPU_BOUNDS[0], cpu))
            mem = min(MEM_BOUNDS[1], max(MEM_BOUNDS[0], mem))
            out.append(Decision(t, d.node, cpu, mem, p.max_retries))
        return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--workflows", type=int, default=60)
    ap.add_argument("--out", type=Path, default=None, help="JSON rows")
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep = ("load:0.8", "load:0.95")
    cases = [
        c for c in scenarios(ScenarioConfig(), args.workflows, (), (0.8, 0.95)) if c.name in keep
    ]
    policies: dict[str, Any] = {
        "heft_history": lambda _s: "heft_history",
        "oracle_res": lambda _s: Oracle(runtime=False),
        "oracle_res_runtime": lambda _s: Oracle(runtime=True),
    }
    if args.model is not None:
        m = load_bundle(args.model, "model")
        policies["model"] = lambda _s: SchedulerPolicy(m, "model")
        policies["model_nodes+hh_res"] = lambda _s: ModelNodes(m, "model_nodes")
        policies["hh_nodes+model_res"] = lambda _s: ModelReservations(m, "model_res")
    rows = evaluate(cases, policies, args.seeds)
    for r in rows:
        print(
            f"{r['scenario']:>10} {r['policy']:>20}  SLA {r['sla_attainment']:.3f}  "
            f"JCT {r['mean_jct_s']:6.0f}  cost {r['cost_core_s']:8.0f}  oom {r['oom_kills']:.1f}"
        )
    if args.out is not None:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
