"""Where do the replay judge's replays go wrong in the shifted world? Per recorded window,
the champion and a variant each played three ways from the same start (an empty cluster, the
warm-up, the history the policies had):

- `replay`: as the judge replays it (tasks drawn from the learned family distributions, the
  estimated restart cost, fault rates and cluster);
- `true tasks`: the replay's estimated world, with the tasks on the recorded run's hidden
  truth (its families' medians, each task's own draw from the replay's seed);
- `true`: the true world (the hidden truth and the real shift).

`replay` against `true tasks` is what the learned task model gets wrong; `true tasks` against
`true` is what the estimated restart cost, faults and cluster get wrong.

    .venv/bin/python experiments/replay_counterfactual.py [--seed 0] [--workflows 800]
        [--replays 4] [--variant-cpu -0.4] [--variant-mem 0.0] [--from-window 0]
        [--out FILE]

Prints one row per window and writes JSON (default
experiments/results/replay_counterfactual.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from online_shift import CHAMPION, shift_time, workload

from dagsched.core.history import History
from dagsched.learner.head_search import with_shifts
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import ObservedWindow, TrafficRecorder, config_from, replay_seed
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import ReplayResult, WorkflowEnds, play
from dagsched.sim.snapshot import SchedulerPolicy
from dagsched.sim.truth import HiddenTruth


def true_play(
    w: ObservedWindow, sc: ScenarioConfig, sched: GNNScheduler, run_seed: int, seed: int
) -> ReplayResult:
    """The window from the same start as its replay, on the simulator's hidden truth: the
    recorded run's families (drawn from `run_seed`), each task's own ratios from `seed`."""
    counted = frozenset(x.id for x in w.workflows)
    tracker = WorkflowEnds(counted)
    history = History()
    history.families = copy.deepcopy(dict(w.history))
    wfs = sorted([*w.warmup, *w.workflows], key=lambda x: x.arrival_s)
    sim = Simulator(
        sc, wfs, seed=seed, on_outcome=tracker, history=history,
        truth=HiddenTruth(sc.truth, run_seed),
    )  # fmt: skip
    tracker.sim = sim
    sim.run(SchedulerPolicy(sched))
    return tracker.result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workflows", type=int, default=800)
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--variant-cpu", type=float, default=-0.4)
    ap.add_argument("--variant-mem", type=float, default=0.0)
    ap.add_argument(
        "--from-window", type=int, default=0, help="replay only this window and the later ones"
    )
    ap.add_argument(
        "--out", type=Path, default=Path("experiments/results/replay_counterfactual.json")
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    n = args.workflows
    base = replace(s.sim, workload=replace(s.sim.workload, workflows=n), shift=None)
    sc = replace(base, shift=replace(s.sim.shift, at_s=shift_time(base, args.seed, n, 0.1)))
    true_sc = replace(base, shift=replace(s.sim.shift, at_s=0.0))  # every window is after it
    champ = load_bundle(CHAMPION, "v1")
    moved = {k: v for k, v in (("cpu", args.variant_cpu), ("mem", args.variant_mem)) if v}
    variant = GNNScheduler(with_shifts(champ.model, moved), champ.normalizer, "variant")
    rec = TrafficRecorder.of(config_from(s.evaluator.replay))
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=args.seed, on_outcome=hook),
        SchedulerPolicy(champ), rec, workload(sc, args.seed, n),
    )  # fmt: skip
    rows: list[dict[str, Any]] = []
    print(f"{'window':>6} {'observed':>9} {'replay':>8} {'true tasks':>10} {'true':>8} "
          f"{'variant gain: replay':>21} {'true tasks':>10} {'true':>6}")  # fmt: skip
    for w in (w for w in wins if w.index >= args.from_window):
        world = w.world(sc)
        seeds = [replay_seed(0, w.index, k) for k in range(args.replays)]
        r = {
            name: {
                "replay": float(np.mean([play(world, SchedulerPolicy(p), k).judged_jct_s
                                         for k in seeds])),
                "true_tasks": float(np.mean([true_play(w, world.scenario, p, args.seed, k)
                                             .judged_jct_s for k in seeds])),
                "true": float(np.mean([true_play(w, true_sc, p, args.seed, k).judged_jct_s
                                       for k in seeds])),
            }
            for name, p in (("champion", champ), ("variant", variant))
        }  # fmt: skip
        gain = {k: 1 - r["variant"][k] / r["champion"][k] for k in ("replay", "true_tasks", "true")}
        rows.append({"window": w.index, "observed_jct_s": w.mean_jct_s,
                     "oom_restart_s": w.oom_restart_s, **r, "variant_gain": gain})  # fmt: skip
        c = r["champion"]
        print(f"{w.index:>6} {w.mean_jct_s:>9.0f} {c['replay']:>8.0f} {c['true_tasks']:>10.0f} "
              f"{c['true']:>8.0f} {gain['replay']:>+21.1%} {gain['true_tasks']:>+10.1%} "
              f"{gain['true']:>+6.1%}", flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": {**vars(args), "out": str(args.out)}, "variant": moved, "windows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
