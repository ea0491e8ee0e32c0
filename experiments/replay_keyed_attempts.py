"""How much of the replay judge's per-replay noise is transient failures landing on other tasks?

The interference case's champion run is recorded as `bench/replay_interference.py` records
it; the chosen windows are replayed K times for the champion against the variant (CPU -0.4
in logit space) and against the float-error copy, with each task's transient failures drawn
at its arrival (`keyed_attempts`, what the judge replays with) and drawn from the run's one
stream as attempts start (the engine's default). Printed and written: the mean and the
spread of the per-replay relative JCT differences.

    .venv/bin/python experiments/replay_keyed_attempts.py [--seed 1] [--workflows 500]
        [--windows 2,3] [--replays 8] [--out experiments/results/replay_keyed_attempts.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

import torch
from online_shift import CHAMPION, shift_time, workload

from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    TrafficRecorder,
    config_from,
    paired_diffs,
    replay_seed,
)
from dagsched.learner.variants import ShiftedReservation
from dagsched.policy.bundle import load_bundle
from dagsched.settings import load_settings
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import play
from dagsched.sim.snapshot import SchedulerPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workflows", type=int, default=500)
    ap.add_argument("--windows", default="2,3")
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--out", type=Path,
                    default=Path("experiments/results/replay_keyed_attempts.json"))  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    champion = load_bundle(CHAMPION, "v1")
    others = {
        "variant": ShiftedReservation(champion, "cpu", -0.4, "variant"),
        "copy": ShiftedReservation(champion, "cpu", 0.0, "copy"),
    }
    cfg = config_from(s.evaluator.replay)
    n, seed = args.workflows, args.seed
    sc0 = replace(s.sim, workload=replace(s.sim.workload, workflows=n), shift=None)
    at = shift_time(sc0, seed, n, 0.1)
    sc = replace(sc0, shift=replace(s.sim.shift, at_s=at, release_every=0.0))
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=seed, on_outcome=hook),
        SchedulerPolicy(champion), TrafficRecorder.of(cfg), workload(sc, seed, n),
    )  # fmt: skip
    wanted = {int(w) for w in args.windows.split(",")}
    rows: list[dict[str, Any]] = []
    for w in (w for w in wins if w.index in wanted):
        world = w.world(sc)
        for keyed in (False, True):
            played = replace(world, keyed_attempts=keyed)
            for name, other in others.items():
                diffs = []
                for k in range(args.replays):
                    sd = replay_seed(cfg.seed, w.index, k)
                    a = play(played, SchedulerPolicy(champion), sd)
                    diffs.append(paired_diffs(a, play(played, SchedulerPolicy(other), sd))["jct"])
                row = {"window": w.index, "keyed": keyed, "version": name,
                       "mean": statistics.fmean(diffs), "sd": statistics.stdev(diffs),
                       "diffs": diffs}  # fmt: skip
                rows.append(row)
                print(f"window {w.index} keyed={keyed!s:5} {name:7s} mean {row['mean']:+.3f}"
                      f" sd {row['sd']:.3f}", flush=True)  # fmt: skip
    args.out.write_text(json.dumps({"config": vars(args) | {"out": str(args.out)}, "rows": rows},
                                   indent=1))  # fmt: skip
    print(args.out)


if __name__ == "__main__":
    main()
