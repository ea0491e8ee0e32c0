"""Where does the replay judge's JCT error come from: the state its replays start in, or
the traffic they end in? Per recorded window of the frozen champion in `shift`, the
champion's replay four ways:

- `no after`: the warm-up (the `warmup_workflows` arrivals before the window, on an empty
  cluster) and the window alone, as the judge replayed it before `ObservedWindow.after`;
- `judge`: as the judge replays it now, the later arrivals that came while the window's
  workflows ran included;
- `long`: that, with three times the warm-up;
- `in flight`: that, plus every workflow still in flight when the first warm-up workflow
  arrived, cut to its tasks not yet finished then (what the task end events tell), arriving
  at that moment with its own due time;
- `after all`: the judge's replay with every later arrival that came while the window's
  workflows ran, not only the first `after_workflows`;
- `all in flight`: `after all` and `in flight` together.

`--variants` picks which (default: the first four).

    .venv/bin/python experiments/replay_start_state.py [--seed 0] [--workflows 1500]
        [--replays 2] [--from-window 6] [--to-window N] [--variants a,b,...]
        [--release-every R] [--out FILE]

Prints one row per window (observed mean JCT, and each replay's prediction and error) and
writes JSON (default experiments/results/replay_start_state.json).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from online_shift import CHAMPION, shift_time, workload

from dagsched.core.workflow import Workflow
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    ObservedWindow,
    TrafficRecorder,
    config_from,
    remainder,
    replay_seed,
)
from dagsched.policy.bundle import load_bundle
from dagsched.settings import load_settings
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import ReplayWorld, play
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import TaskRun
from dagsched.sim.snapshot import SchedulerPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workflows", type=int, default=1500)
    ap.add_argument("--replays", type=int, default=2)
    ap.add_argument("--from-window", type=int, default=6)
    ap.add_argument("--to-window", type=int, default=None, help="default: the last")
    ap.add_argument(
        "--variants", default="no_after,judge,long,in_flight",
        help="of no_after, judge, long, in_flight, after_all, all_in_flight",
    )  # fmt: skip
    ap.add_argument(
        "--release-every", type=float, default=None, help="default: the shift profile's"
    )
    ap.add_argument("--out", type=Path, default=Path("experiments/results/replay_start_state.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    n = args.workflows
    base = replace(s.sim, workload=replace(s.sim.workload, workflows=n), shift=None)
    shift = replace(s.sim.shift, at_s=shift_time(base, args.seed, n, 0.1))
    if args.release_every is not None:
        shift = replace(shift, release_every=args.release_every)
    sc = replace(base, shift=shift)
    champ = load_bundle(CHAMPION, "v1")
    warm = s.evaluator.replay.warmup_workflows
    rec = TrafficRecorder.of(config_from(s.evaluator.replay))
    finished: dict[tuple[str, int], float] = {}  # (workflow, task) -> when it finished
    ended: dict[str, float] = {}
    every: dict[str, Workflow] = {}
    holder: list[Simulator] = []

    def factory(wfs: Any, hook: Any) -> Simulator:
        def on(t: TaskRun, o: TaskOutcome, r: float) -> None:
            now = holder[0].now
            if not o.failed:
                finished[(t.run.wf.id, t.idx)] = now
            if (o.failed and t.failures + 1 > t.max_retries) or (
                not o.failed and t.run.remaining == 1
            ):
                ended[t.run.wf.id] = now
            hook(t, o, r)

        def seen(it: Any) -> Any:
            for wf in it:
                every[wf.id] = wf
                yield wf

        sim = Simulator(sc, seen(wfs), seed=args.seed, on_outcome=on)
        holder.append(sim)
        return sim

    wins = record_run(factory, SchedulerPolicy(champ), rec, workload(sc, args.seed, n))
    order = sorted(every.values(), key=lambda w: w.arrival_s)
    pos = {w.id: k for k, w in enumerate(order)}

    def predicted(w: ObservedWindow, world: ReplayWorld) -> float:
        seeds = [replay_seed(0, w.index, k) for k in range(args.replays)]
        got = [play(world, SchedulerPolicy(champ), k) for k in seeds]
        per = [np.mean([r.jct_s[i] for r in got if i in r.jct_s]) for i in w.jct_s]
        return float(np.mean(per))

    rows = []
    variants = args.variants.split(",")
    last_window = args.to_window if args.to_window is not None else len(wins)
    print(f"{'window':>6} {'observed':>9} "
          + " ".join(f"{v.replace('_', ' '):>16}" for v in variants)
          + f" {'carried':>8} {'after':>6} {'all':>6}")  # fmt: skip
    for w in (w for w in wins if args.from_window <= w.index <= last_window):
        first = pos[w.warmup[0].id] if w.warmup else pos[w.workflows[0].id]
        t0 = order[first].arrival_s
        long_warm = order[max(0, first - 2 * warm) : first]
        carried = []
        for wf in order[:first]:
            if ended.get(wf.id, float("inf")) > t0:
                done = {i for i in range(wf.size) if finished.get((wf.id, i), 1e18) <= t0}
                cut = remainder(wf, done, t0)
                if cut is not None:
                    carried.append(cut)
        last = max(pos[x.id] for x in w.workflows)
        last_end = max(ended.get(x.id, x.arrival_s) for x in w.workflows)
        after_all = [x for x in order[last + 1 :] if x.arrival_s < last_end]
        in_flight = [*carried, *w.warmup]
        every_world = {  # (warm-up, later arrivals) per variant
            "no_after": (w.warmup, []),
            "judge": (w.warmup, w.after),
            "long": ([*long_warm, *w.warmup], w.after),
            "in_flight": (in_flight, w.after),
            "after_all": (w.warmup, after_all),
            "all_in_flight": (in_flight, after_all),
        }
        worlds = {
            k: replace(w, warmup=every_world[k][0], after=every_world[k][1]).world(sc)
            for k in variants
        }
        obs = float(np.mean(list(w.jct_s.values())))
        pred = {k: predicted(w, world) for k, world in worlds.items()}
        err = {k: (v - obs) / obs for k, v in pred.items()}
        rows.append({"window": w.index, "observed_jct_s": obs, "predicted_jct_s": pred,
                     "err": err, "carried": len(carried), "after": len(w.after),
                     "after_all": len(after_all)})  # fmt: skip
        print(f"{w.index:>6} {obs:>9.0f} "
              + " ".join(f"{pred[k]:>8.0f} ({err[k]:+5.1%})" for k in worlds)
              + f" {len(carried):>8} {len(w.after):>6} {len(after_all):>6}",
              flush=True)  # fmt: skip
    arms = list(rows[0]["err"]) if rows else []
    summary = {
        k: {"mean_err": float(np.mean([r["err"][k] for r in rows])),
            "mean_abs_err": float(np.mean([abs(r["err"][k]) for r in rows]))}
        for k in arms
    }  # fmt: skip
    print("mean error " + "  ".join(f"{k} {v['mean_err']:+.1%}" for k, v in summary.items()))
    print("mean |error| " + "  ".join(f"{k} {v['mean_abs_err']:.1%}" for k, v in summary.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": {**vars(args), "out": str(args.out)}, "summary": summary, "windows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
