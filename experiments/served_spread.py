"""How far can one window's observed mean JCT move on a change no replay could see? The
setting of `replay_as_served.py` (`shift` seed 1, the frozen champion with memory -0.2 on
the loop's 30% slice) played on the hidden truth to `--workflows` arrivals, with the slice
switched on at arrival 432 moved by a few seconds each time (`--offsets`; the loop's own
round registered it 48 s before that arrival). Nothing else changes: the same arrivals, the
same hidden truth, the same seed. Per window of 100 arrivals: the mean JCT of the workflows
the champion served, in each run, and their spread (max / min). A replay predicts an
expectation; what it is compared with is one of these.

    .venv/bin/python experiments/served_spread.py [--workflows 1000]
        [--offsets -48,-30,-15,0,15,30,45,60] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from replay_as_served import SEED, SLICE_FROM, LoopRun
from tqdm import tqdm

from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import WorkflowEnds

WINDOW = 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=1000, help="arrivals played")
    ap.add_argument("--offsets", default="-48,-30,-15,0,15,30,45,60",
                    help="seconds the slice starts after arrival 432")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("experiments/results/served_spread.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    run = LoopRun.of(args.workflows)
    sc, arrivals, slice_, at_s = run.scenario, run.arrivals, run.slice, run.from_s
    offsets = [float(x) for x in args.offsets.split(",")]
    runs: list[dict[str, Any]] = []
    for off in tqdm(offsets, desc="runs", unit="run", file=sys.stderr):
        from_s = at_s + off
        ends = WorkflowEnds(frozenset(w.id for w in arrivals))
        sim = Simulator(sc, arrivals, seed=SEED, on_outcome=ends)
        ends.sim = sim
        sim.run(run.served(from_s))
        jct = ends.result.jct_s
        windows = []
        for lo in range(0, len(arrivals), WINDOW):
            mine = [w for w in arrivals[lo : lo + WINDOW]
                    if not (w.id in slice_ and w.arrival_s >= from_s)]  # fmt: skip
            served = [jct[w.id] for w in mine if w.id in jct]
            windows.append(float(np.mean(served)) if served else 0.0)
        runs.append({"offset_s": off, "window_jct_s": windows, "oom_kills": sim.metrics.oom_kills})
    n = len(runs[0]["window_jct_s"])
    head = f"{'window':>6} " + " ".join(f"{o:>+6.0f}" for o in offsets) + f" {'max/min':>8}"
    print(f"mean JCT of the champion's workflows by window, the slice from arrival "
          f"{SLICE_FROM} + offset (s)\n{head}")  # fmt: skip
    spread = []
    for k in range(n):
        row = [r["window_jct_s"][k] for r in runs]
        spread.append(max(row) / min(row) if min(row) > 0 else float("inf"))
        print(f"{k:>6} " + " ".join(f"{v:>6.0f}" for v in row) + f" {spread[-1]:>8.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": {**vars(args), "out": str(args.out)}, "runs": runs, "spread": spread}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
