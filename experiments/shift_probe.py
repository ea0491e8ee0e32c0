"""How strong is a shifted world: heft_history, the frozen champion and the frozen champion
with a larger memory margin, on a few seeds of a candidate shift.

The margin probe moves the champion's memory output by `b` in the continuous head's logit
space (the bias of the memory mean in `cont_head`'s last layer): the one direction in which
fine-tuning the actor heads can move every memory reservation at once. If no `b` beats the
frozen champion, head fine-tuning has little to find in that world.

    .venv/bin/python experiments/shift_probe.py [--profile shift] [--oom-restart S]
        [--mem-spread X] [--neighbour K] [--release-every N] [--load L] [--seed0 10000]
        [--seeds 2] [--workflows 150] [--warmup 0] [--margins 0.3,0.6]
        [--policies heft_history] [--json]

Flags override the profile's `sim.shift` and load; the shift is on from t=0. `--warmup N`
leaves the first N arrivals of each run uncounted (steady state: the cluster and the
history are no longer empty). Prints one row per policy (mean over seeds) and writes
nothing unless `--out FILE`.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig, ShiftConfig
from dagsched.sim.runner import steady_state
from dagsched.sim.snapshot import SchedulerPolicy

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"
KEYS = ("sla_attainment", "mean_jct_s", "oom_kills", "workflows_failed")
MEM_MEAN = 2  # cont_head's outputs: (cpu mean, cpu conc, mem mean, mem conc, retry mean, ...)


def with_margin(sched: GNNScheduler, b: float) -> GNNScheduler:
    """`sched` with its memory output moved by `b` in the continuous head's logit space."""
    model = copy.deepcopy(sched.model)
    with torch.no_grad():
        model.cont_head[-1].bias[MEM_MEAN] += b
    return GNNScheduler(model, sched.normalizer, f"{sched.version}+mem{b:+g}")


def scenario(args: argparse.Namespace) -> ScenarioConfig:
    s = load_settings(profile=args.profile)
    shift = s.sim.shift or ShiftConfig()
    upd = {
        k: v
        for k, v in (
            ("oom_restart_s", args.oom_restart),
            ("mem_spread", args.mem_spread),
            ("neighbour_slowdown", args.neighbour),
            ("release_every", args.release_every),
        )
        if v is not None
    }
    shift = replace(shift, at_s=0.0, **upd)
    wl = replace(s.sim.workload, workflows=args.workflows)
    if args.load is not None:
        wl = replace(wl, load=args.load)
    return replace(s.sim, shift=None if args.no_shift else shift, workload=wl)


def row(sc: ScenarioConfig, policy: Any, seeds: list[int], warmup: int) -> dict[str, Any]:
    rows = []
    for s in seeds:
        pol = policy if isinstance(policy, str) else SchedulerPolicy(policy)
        rows.append(steady_state(sc, pol, seed=s, warmup=warmup))
    out: dict[str, Any] = {k: float(np.mean([r[k] for r in rows])) for k in KEYS}
    out["per_seed_sla"] = [round(float(r["sla_attainment"]), 3) for r in rows]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="shift")
    ap.add_argument("--no-shift", action="store_true", help="the training world instead")
    ap.add_argument("--oom-restart", type=float, default=None)
    ap.add_argument("--mem-spread", type=float, default=None)
    ap.add_argument("--neighbour", type=float, default=None)
    ap.add_argument("--release-every", type=float, default=None)
    ap.add_argument("--load", type=float, default=None)
    ap.add_argument("--seed0", type=int, default=10_000)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workflows", type=int, default=150)
    ap.add_argument("--warmup", type=int, default=0, help="arrivals left uncounted per run")
    ap.add_argument("--margins", default="0.3,0.6", help="comma-separated b; '' for none")
    ap.add_argument("--policies", default="heft_history", help="baselines, comma-separated")
    ap.add_argument("--champion", type=Path, default=CHAMPION, help="a model bundle folder")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    sc = scenario(args)
    seeds = [args.seed0 + i for i in range(args.seeds)]
    champion = load_bundle(args.champion, "v1")
    arms: dict[str, Any] = {p: p for p in args.policies.split(",") if p}
    arms["frozen"] = champion
    for b in (float(x) for x in args.margins.split(",") if x):
        arms[f"margin {b:+g}"] = with_margin(champion, b)
    t0 = time.perf_counter()
    res = {}
    for name, pol in arms.items():
        res[name] = row(sc, pol, seeds, args.warmup)
        r = res[name]
        if not args.json:
            print(
                f"{name:14s} SLA {r['sla_attainment']:.3f} {r['per_seed_sla']}  "
                f"JCT {r['mean_jct_s']:7.0f}  OOM {r['oom_kills']:5.1f}  "
                f"failed {r['workflows_failed']:.1f}",
                flush=True,
            )
    doc = {
        "shift": None if sc.shift is None else asdict(sc.shift),
        "load": sc.workload.load,
        "seeds": seeds,
        "workflows": args.workflows,
        "warmup": args.warmup,
        "arms": res,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    if args.json:
        print(json.dumps(to_jsonable(doc)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(to_jsonable(doc), indent=2) + "\n")


if __name__ == "__main__":
    main()
