"""What does a challenger with a tighter memory reservation change that the replay misses?
The setting of `replay_as_served.py` (`shift` seed 1, memory -0.2 on the loop's 30% slice
from arrival 432), each window replayed as served; per window, over the champion's counted
workflows and over the slice's, observed against replayed: mean JCT, workflows over an
hour, OOM kills per 100 tasks, workflows that ran out of retries, and the tasks' memory
peak ratios (the hidden truth's against the learned truth's draws). Each window is replayed
twice: on the learned truth, as the judge does, and with every task that finished before
the window closed at the ratios its end event measured (`measured`: what a trace replay
would use; the others still drawn), to ask whether the error is the draws or the world.

    .venv/bin/python experiments/replay_ooms.py [--workflows 800] [--from-window 4]
        [--to-window 6] [--replays 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import copy
import json
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from replay_as_served import SEED, LoopRun

from dagsched.core.history import History, measured_ratios
from dagsched.core.workflow import Workflow
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import TrafficRecorder, config_from, replay_seed
from dagsched.sim.engine import Simulator
from dagsched.sim.learned_truth import LearnedTruth
from dagsched.sim.replay_world import ReplayResult, ReplayWorld, WorkflowEnds
from dagsched.sim.runs import FailureKind, Policy, TaskRun


class Counting(Simulator):
    """A simulator that counts, per workflow, OOM kills, whether it ran out of retries and
    its tasks' memory peak ratios (as drawn on arrival)."""

    def __init__(self, *a: Any, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.ooms: dict[str, int] = defaultdict(int)
        self.failed: set[str] = set()
        self.peaks: dict[str, list[float]] = {}

    def _arrive(self, wf: Workflow) -> None:
        super()._arrive(wf)
        run = self.active[wf.id]
        self.peaks[wf.id] = [t.peak_mem / t.spec.mem_gb for t in run.tasks]

    def _fail(self, t: TaskRun, why: FailureKind) -> None:
        if why == FailureKind.OOM:
            self.ooms[t.run.wf.id] += 1
        if t.failures + 1 > t.max_retries:
            self.failed.add(t.run.wf.id)
        super()._fail(t, why)


Ratios = tuple[float, float, float]


class MeasuredTruth(LearnedTruth):
    """The learned truth, but a task whose end event was seen runs at the ratios measured."""

    def __init__(self, families: Any, measured: dict[tuple[str, int], Ratios]) -> None:
        super().__init__(families)
        self.measured = measured

    def draw(self, wf: Workflow, rng: np.random.Generator, mem_spread: float = 1.0) -> np.ndarray:
        out = super().draw(wf, rng, mem_spread)  # the same uniforms either way
        for i in range(wf.size):
            got = self.measured.get((wf.id, i))
            if got is not None:
                out[i] = got
        return out


def replay(world: ReplayWorld, policy: Policy, seed: int, truth: LearnedTruth,
           ) -> tuple[Counting, ReplayResult]:  # fmt: skip
    """`replay_world.play` on a counting simulator over `truth`."""
    tracker = WorkflowEnds(world.counted)
    history = History()
    history.families = copy.deepcopy(dict(world.history))
    sim = Counting(world.scenario, world.workflows, seed=seed, on_outcome=tracker, truth=truth,
                   history=history, keyed_attempts=world.keyed_attempts)  # fmt: skip
    tracker.sim = sim
    while len(tracker.result.jct_s) < len(world.counted) and (batch := sim.advance()) is not None:
        sim.apply(policy.decide(sim, batch), batch)
    return sim, tracker.result


def summary(sim: Counting, jct_s: dict[str, float], ids: list[str]) -> dict[str, float]:
    tasks = sum(len(sim.peaks[i]) for i in ids)
    peaks = np.concatenate([sim.peaks[i] for i in ids]) if ids else np.zeros(1)
    ended = [jct_s[i] for i in ids if i in jct_s]
    return {
        "workflows": len(ids),
        "mean_jct_s": float(np.mean(ended)) if ended else 0.0,
        "over_1h": sum(j > 3600 for j in ended),
        "ooms_per_100_tasks": 100.0 * sum(sim.ooms.get(i, 0) for i in ids) / max(tasks, 1),
        "failed_share": sum(i in sim.failed for i in ids) / max(len(ids), 1),
        "peak_p50": float(np.percentile(peaks, 50)),
        "peak_p90": float(np.percentile(peaks, 90)),
        "peak_p99": float(np.percentile(peaks, 99)),
    }


def measured_ends(
    sim: Simulator, arrivals: list[Workflow]
) -> dict[tuple[str, int], tuple[float, Ratios]]:
    """Every finished attempt of the run: (end time, ratios its end event measured)."""
    spec = {w.id: w for w in arrivals}
    out = {}
    assert sim.ledger.log is not None
    for r in sim.ledger.log:
        if r.outcome != "done":
            continue
        t = spec[r.wf_id].tasks[r.idx]
        speed = sim.cluster.speed_rows[r.node][t.type]
        m = measured_ratios(t.duration_s, t.cpu_cores, t.mem_gb, speed, r.runtime_s,
                            r.cpu_core_s, r.peak_mem_gb)  # fmt: skip
        out[(r.wf_id, r.idx)] = (r.end_s, (m.cpu, m.mem, m.runtime))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=800, help="arrivals played")
    ap.add_argument("--from-window", type=int, default=4)
    ap.add_argument("--to-window", type=int, default=6)
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/replay_ooms.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    run = LoopRun.of(args.workflows)
    sc, arrivals, others = run.scenario, run.arrivals, run.others
    cfg = replace(config_from(run.settings.evaluator.replay), replays=args.replays)
    served: list[Counting] = []

    def factory(arrivals: Any, hook: Any) -> Simulator:
        served.append(Counting(sc, arrivals, seed=SEED, on_outcome=hook, keep_log=True))
        return served[-1]

    closed = record_run(factory, run.served(), TrafficRecorder.of(cfg), arrivals,
                        served=lambda wid: wid not in others, as_they_close=True)  # fmt: skip
    real = served[0]
    ends = measured_ends(real, arrivals)
    arrival = {w.id: w.arrival_s for w in arrivals}
    rows: list[dict[str, Any]] = []
    for w in closed:
        if not args.from_window <= w.index <= args.to_window:
            continue
        world = w.world(sc)
        closed_s = max(arrival[i] + j for i, j in w.jct_s.items())  # its last workflow's end
        measured = {k: v for k, (end, v) in ends.items() if end <= closed_s}
        truths = {"learned": LearnedTruth(w.families),
                  "measured": MeasuredTruth(w.families, measured)}  # fmt: skip
        ids = [x.id for x in w.workflows if x.id in w.jct_s]
        groups = {"champion": [i for i in ids if i not in others],
                  "slice": [i for i in ids if i in others]}  # fmt: skip
        row: dict[str, Any] = {"window": w.index}
        plays = {
            name: [replay(world, run.as_recorded(), replay_seed(cfg.seed, w.index, k), truth)
                   for k in range(args.replays)]
            for name, truth in truths.items()
        }  # fmt: skip
        for group, members in groups.items():
            if not members:  # no slice before it was served
                continue
            obs = summary(real, w.jct_s, members)
            row[group] = {"observed": obs}
            print(f"window {w.index} {group} ({len(members)} workflows)")
            print(f"  {'observed':>9}: " + "  ".join(f"{k} {v:.3g}" for k, v in obs.items()
                                                     if k != "workflows"))  # fmt: skip
            for name, got in plays.items():
                reps = [summary(sim, res.jct_s, members) for sim, res in got]
                mean = {k: float(np.mean([r[k] for r in reps])) for k in obs}
                err = (mean["mean_jct_s"] - obs["mean_jct_s"]) / obs["mean_jct_s"]
                row[group][name] = {**mean, "jct_err": err,
                                    "replay_jct_s": [r["mean_jct_s"] for r in reps]}  # fmt: skip
                print(f"  {name:>9}: " + "  ".join(f"{k} {v:.3g}" for k, v in mean.items()
                                                   if k != "workflows")
                      + f"  err {err:+.1%}", flush=True)  # fmt: skip
        rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": {**vars(args), "out": str(args.out)}, "windows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
