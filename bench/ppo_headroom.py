"""What a learned policy could gain over heft_history: information, ordering, and both.

Held-out seeds of the default scenario at loads 0.8 and 0.95, as `dagsched eval` draws them,
every policy deciding through the same views the daemon builds (`core.heft.HeftHistory`):

- heft_history with each queue-priority rule: FIFO, SRPT (remaining declared work, the
  policy's base), EDF (deadline) and least slack;
- oracles: heft_history fed *perfect information* - a family history that predicts each
  task's real mean CPU use and memory peak (reserved at x 1.05: no OOM kill, no throttling,
  no waste) and, for `_runtime`, its real run time - with FIFO queues and with the best
  priority rule. Their mean JCT bounds what better predictions can buy on top of ordering;
- with `--model BUNDLE`, the model itself.

    python bench/ppo_headroom.py [--model models/champion] [--seeds 3] [--workflows 200]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.results import write_results

from dagsched.core.demand import VPA_MARGIN
from dagsched.core.heft import PRIORITY_RULES, HeftHistory
from dagsched.core.history import FamilySummary
from dagsched.learner.offline_eval import evaluate, scenarios
from dagsched.policy.bundle import load_bundle
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import SchedulerPolicy, cluster_view, task_view

OUT = Path(__file__).resolve().parent / "results" / "ppo_headroom.json"
RESERVE = 1.05  # the oracle reserves the real use x this


def perfect_history(t: TaskRun, runtime: bool) -> FamilySummary:
    """A history whose recommendation is the task's real use and peak x RESERVE (and, with
    `runtime`, whose runtime prediction is the task's real run time)."""
    s = t.spec
    cpu = t.use_cores * RESERVE / VPA_MARGIN / s.cpu_cores
    mem = t.peak_mem * RESERVE / VPA_MARGIN / s.mem_gb
    ratio = t.true_s / s.duration_s if runtime else 1.0
    return FamilySummary(1000, cpu, cpu, mem, mem, ratio, ratio, 0, 0.0)


class Oracle:
    """heft_history with a priority rule, deciding on views whose history is perfect."""

    def __init__(self, rule: str, runtime: bool) -> None:
        self.heft = HeftHistory(rule)
        self.runtime = runtime
        self.name = f"oracle_{rule}"

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        tvs = []
        for t in ready:
            tv = task_view(t, sim)
            if not self.runtime and tv.history is not None:  # runtime as history predicts
                h = perfect_history(t, False)
                tvs.append(replace(tv, history=replace(h, runtime_ratio=tv.history.runtime_ratio)))
            else:
                tvs.append(replace(tv, history=perfect_history(t, self.runtime)))
        ps = self.heft.place(cluster_view(sim), tvs)
        return [
            Decision(t, p.node, p.cpu, p.mem, p.max_retries, p.priority)
            for t, p in zip(ready, ps, strict=True)
        ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workflows", type=int, default=200)
    ap.add_argument("--rule", default="srpt", choices=sorted(PRIORITY_RULES),
                    help="the priority rule the ordered oracles use")  # fmt: skip
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    keep = ("load:0.8", "load:0.95")
    cases = [
        c for c in scenarios(ScenarioConfig(), args.workflows, (), (0.8, 0.95)) if c.name in keep
    ]
    policies: dict[str, Any] = {
        "heft_history": lambda _s: "heft_history",
        **{f"heft_history_{r}": (lambda _s, r=r: f"heft_history_{r}")
           for r in ("srpt", "edf", "slack")},
        "oracle_res": lambda _s: Oracle("fifo", runtime=False),
        "oracle_res_runtime": lambda _s: Oracle("fifo", runtime=True),
        f"oracle_res_{args.rule}": lambda _s: Oracle(args.rule, runtime=False),
        f"oracle_res_runtime_{args.rule}": lambda _s: Oracle(args.rule, runtime=True),
    }  # fmt: skip
    if args.model is not None:
        m = load_bundle(args.model, "model")
        policies["model"] = lambda _s: SchedulerPolicy(m, "model")
    rows = evaluate(cases, policies, args.seeds)
    base = {r["scenario"]: r["mean_jct_s"] for r in rows if r["policy"] == "heft_history"}
    print(f"{'scenario':>10} {'policy':>28} {'SLA':>6} {'JCT s':>7} {'vs FIFO':>8} {'core-s':>9}")
    for r in rows:
        gain = r["mean_jct_s"] / base[r["scenario"]] - 1
        r["jct_vs_heft_history"] = gain
        print(
            f"{r['scenario']:>10} {r['policy']:>28} {r['sla_attainment']:6.3f} "
            f"{r['mean_jct_s']:7.0f} {gain:+8.1%} {r['cost_core_s']:9.0f}"
        )
    cmd = "python bench/ppo_headroom.py " + " ".join(sys.argv[1:])
    write_results(args.out, {"command": cmd.strip(), "seeds": args.seeds,
                             "workflows": args.workflows, "rows": rows})  # fmt: skip
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
