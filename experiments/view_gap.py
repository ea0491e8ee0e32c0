"""What do the policies lose when the cluster view does not know when running attempts end?

Until the daemon's view carried the running attempts (their start, cold start, declared and
predicted run times), only the simulator's view told a policy when a full node's first
attempt was expected to end; the daemon's read it as "room now". `heft_history` and the
champion's base read that wait (`ClusterView.first_wait_s`), so the daemon served them as if
every full node would free up at once. This runs each policy in the simulator with the full
view and with the view as the daemon had it (no running attempts), on the same seeds.

    .venv/bin/python experiments/view_gap.py [--profile demo] [--workflows 200] [--seeds 2]
        [--warmup 0] [--policies heft_history,champion] [--out FILE]

Prints one row per policy and view (mean over seeds); writes JSON with `--out`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dagsched.core.scheduler import Placement, Scheduler
from dagsched.core.view import ClusterView, TaskView
from dagsched.policy.bundle import load_bundle
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.baselines import HEFT_HISTORY_RULES, HeftHistory
from dagsched.sim.runner import steady_state
from dagsched.sim.snapshot import SchedulerPolicy

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"
KEYS = ("sla_attainment", "mean_jct_s", "oom_kills", "workflows_failed")


class WithoutRunning:
    """`inner`, deciding on a view that does not know when running attempts end."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.version = f"{inner.version} (no running attempts)"

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        blind = replace(cluster, first_end_s=None, running=None)
        return self.inner.place(blind, tasks)


def scheduler(name: str) -> Scheduler:
    if name == "champion":
        return load_bundle(CHAMPION, "v1")
    return HeftHistory(HEFT_HISTORY_RULES[name])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="demo")
    ap.add_argument("--workflows", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=0, help="arrivals left uncounted per run")
    ap.add_argument("--policies", default="heft_history,champion")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile=args.profile)
    sc = replace(s.sim, workload=replace(s.sim.workload, workflows=args.workflows))
    seeds = list(range(args.seeds))
    t0 = time.perf_counter()
    res: dict[str, dict[str, Any]] = {}
    for name in args.policies.split(","):
        for view, wrap in (("full", False), ("no running", True)):
            rows = []
            for seed in seeds:
                sched = scheduler(name)
                pol = SchedulerPolicy(WithoutRunning(sched) if wrap else sched)
                rows.append(steady_state(sc, pol, seed=seed, warmup=args.warmup))
            r = {k: float(np.mean([x[k] for x in rows])) for k in KEYS}
            res[f"{name} / {view}"] = r
            print(
                f"{name:14s} {view:11s} SLA {r['sla_attainment']:.3f}  "
                f"JCT {r['mean_jct_s']:7.1f}  OOM {r['oom_kills']:5.1f}  "
                f"failed {r['workflows_failed']:.1f}",
                flush=True,
            )
    doc = {
        "profile": args.profile,
        "workflows": args.workflows,
        "seeds": seeds,
        "warmup": args.warmup,
        "arms": res,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(to_jsonable(doc), indent=2) + "\n")


if __name__ == "__main__":
    main()
