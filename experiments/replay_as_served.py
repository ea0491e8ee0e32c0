"""Does the work in flight explain the replay's error while a challenger with a tighter memory
reservation serves a slice? `shift` seed 1 (2,000 workflows, the shift at 10% of them) as
the loop first served it: the frozen champion, with its memory reservation moved -0.2 logit
on the loop's 30% slice (`workflow_bucket`) from arrival 432 on (`LoopSlice`). Every
window that closes while the run goes on is replayed as served, as the judge does, with and
without the workflows in flight when its warm-up began (`carry_in_flight`). Printed per
window: the observed and predicted mean JCT of the champion's workflows and the error.

    .venv/bin/python experiments/replay_as_served.py [--workflows 1000] [--from-window 4]
        [--to-window 8] [--replays 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from online_shift import CHAMPION, shift_time, workload

from dagsched.core.workflow import Workflow
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    ReplayJudge,
    TrafficRecorder,
    config_from,
)
from dagsched.learner.variants import ShiftedReservation
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.ab import workflow_bucket
from dagsched.settings import Settings, load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import AsServed
from dagsched.sim.runs import Decision, Policy, TaskRun
from dagsched.sim.snapshot import SchedulerPolicy

SEED = 1
SLICE_FROM = 432  # the arrival at which the loop registered the memory -0.2 challenger
SHARE = 0.3  # the loop's challenger share


class LoopSlice(AsServed):
    """As the loop served: the tasks of the slice's workflows decided by `other` from
    `from_s` on (in flight or not, as the daemon picks an arm per task), all by `main`
    before."""

    def __init__(self, main: Policy, other: Policy, others: frozenset[str], from_s: float) -> None:
        super().__init__(main, dict.fromkeys(others, other))
        self.from_s = from_s

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        if sim.now < self.from_s:
            return self.main.decide(sim, ready)
        return super().decide(sim, ready)


@dataclass
class LoopRun:
    """Seed 1 of `shift` (2,000 workflows, the shift at 10% of them) as the loop first
    served it: its first `workflows` arrivals, the frozen champion, and the challenger the
    loop's first search found (memory -0.2 logit) on the loop's 30% slice from `from_s`."""

    settings: Settings
    scenario: ScenarioConfig
    champion: GNNScheduler
    challenger: ShiftedReservation
    arrivals: list[Workflow]
    slice: frozenset[str]  # the slice's workflows (`workflow_bucket`), whenever they came
    from_s: float  # when the slice began to be served: arrival `SLICE_FROM`

    @staticmethod
    def of(workflows: int) -> LoopRun:
        s = load_settings(profile="shift")
        assert s.sim.shift is not None
        base = replace(s.sim, workload=replace(s.sim.workload, workflows=2000), shift=None)
        sc = replace(base, shift=replace(s.sim.shift, at_s=shift_time(base, SEED, 2000, 0.1)))
        champion = load_bundle(CHAMPION, "v1")
        every = list(workload(sc, SEED, 2000))
        arrivals = every[:workflows]
        return LoopRun(
            s, sc, champion, ShiftedReservation(champion, "mem", -0.2, "mem"), arrivals,
            frozenset(w.id for w in arrivals if workflow_bucket(w.id) < SHARE),
            every[SLICE_FROM].arrival_s,
        )  # fmt: skip

    @property
    def others(self) -> frozenset[str]:
        """What the loop's recorder marks as served elsewhere: the slice's workflows that
        arrived once it was served (their first decision was the challenger's)."""
        return frozenset(w.id for w in self.arrivals if w.id in self.slice
                         and w.arrival_s >= self.from_s)  # fmt: skip

    def served(self, from_s: float | None = None) -> LoopSlice:
        """The run's policy, the slice served from `from_s` (default: as the loop did)."""
        return LoopSlice(SchedulerPolicy(self.champion), SchedulerPolicy(self.challenger),
                         self.slice, self.from_s if from_s is None else from_s)  # fmt: skip

    def as_recorded(self) -> AsServed:
        """The run as the judge replays it: the challenger on `others`."""
        challenger = SchedulerPolicy(self.challenger)
        return AsServed(SchedulerPolicy(self.champion), dict.fromkeys(self.others, challenger))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=1000, help="arrivals played")
    ap.add_argument("--from-window", type=int, default=4)
    ap.add_argument("--to-window", type=int, default=8)
    ap.add_argument("--replays", type=int, default=4)
    ap.add_argument("--out", type=Path, default=Path("experiments/results/replay_as_served.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    run = LoopRun.of(args.workflows)
    sc, others = run.scenario, run.others
    cfg = replace(
        config_from(run.settings.evaluator.replay),
        carry_in_flight=True,
        replays=args.replays,
        fidelity_windows=1,  # each window on its own
    )
    closed = record_run(
        lambda arrivals, hook: Simulator(sc, arrivals, seed=SEED, on_outcome=hook),
        run.served(),
        TrafficRecorder.of(cfg),
        run.arrivals,
        served=lambda wid: wid not in others,
        as_they_close=True,  # as the loop closes them: with what is known then
    )
    rows: list[dict[str, Any]] = []
    head = ("window", "carried", "slice", "observed", "judge", "with carried")
    print(" ".join(f"{h:>{n}}" for h, n in zip(head, (6, 7, 5, 9, 15, 15), strict=True)))
    for w in closed:
        if not args.from_window <= w.index <= args.to_window:
            continue
        row: dict[str, Any] = {"window": w.index, "carried": len(w.carried),
                               "elsewhere": len(w.elsewhere),
                               "oom_restart_s": w.oom_restart_s}  # fmt: skip
        for name, obs in (("judge", replace(w, carried=[])), ("with_carried", w)):
            report = ReplayJudge(cfg, sc).judge(
                obs,
                lambda _s: SchedulerPolicy(run.champion),
                lambda _s: SchedulerPolicy(run.challenger),
            )
            f = report.fidelity
            err = (f.predicted_jct_s - f.observed_jct_s) / f.observed_jct_s
            row[name] = {"observed_jct_s": f.observed_jct_s,
                         "predicted_jct_s": f.predicted_jct_s, "err": err}  # fmt: skip
        rows.append(row)
        print(f"{w.index:>6} {row['carried']:>7} {row['elsewhere']:>5} "
              f"{row['judge']['observed_jct_s']:>9.0f} "
              + " ".join(f"{row[k]['predicted_jct_s']:>6.0f} ({row[k]['err']:+6.1%})"
                         for k in ("judge", "with_carried")), flush=True)  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"config": {**vars(args), "out": str(args.out)}, "windows": rows}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
