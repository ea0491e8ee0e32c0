"""Which per-replay difference tells the interference variant from an identical copy soonest?

Per recorded window of the champion in the interference world (`bench/replay_interference.py`'s:
`shift` without releases), K paired replays of the champion, the variant (CPU reservation
shifted by `--shift` in logit space) and the copy (shift 0), as the replay judge plays them.
Each replay's difference is then measured three ways, all "challenger better > 0" and all a
relative speed-up:

- `rel_mean`: the relative reduction of mean JCT (a failed workflow at two deadlines), what
  the judge tests today;
- `log_ratio`: the mean over workflows of log(JCT champion / JCT challenger), the same
  workflow in the same replay: the live A/B's speed, paired;
- `trimmed`: `log_ratio` with the 5% most extreme per-workflow ratios each side cut.

And the truth: the variant and the champion each serving the whole run on the simulator's
hidden truth, per window (`whole_rel_mean`).

Per metric it prints the windows' mean gains, the within-window SD of a replay, the SD of the
window means, and the t of the variant's and the copy's mean over windows (mean / (SD of
window means / sqrt(G))): the metric whose variant t is largest against a copy t near 0 is
the one the paired test decides on soonest.

    .venv/bin/python experiments/replay_metric_noise.py [--seed 0] [--workflows 600]
        [--replays 8] [--warmup N] [--baseline] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from online_shift import CHAMPION, shift_time, workload

from dagsched.core.heft import HeftHistory
from dagsched.core.scheduler import Scheduler
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import TrafficRecorder, config_from, replay_seed
from dagsched.learner.variants import ShiftedReservation
from dagsched.policy.bundle import load_bundle
from dagsched.settings import load_settings
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import FAILED_JCT_RATIO, ReplayResult, play
from dagsched.sim.snapshot import SchedulerPolicy

TRIM = 0.05


def judged(r: ReplayResult) -> dict[str, float]:
    return {
        i: max(j, FAILED_JCT_RATIO * r.failed[i]) if i in r.failed else j
        for i, j in r.jct_s.items()
    }


def metrics(base: ReplayResult, other: ReplayResult) -> dict[str, float]:
    a, b = judged(base), judged(other)
    ids = [i for i in a if i in b]
    ma, mb = np.mean([a[i] for i in ids]), np.mean([b[i] for i in ids])
    lr = np.sort([np.log(max(a[i], 1e-6) / max(b[i], 1e-6)) for i in ids])
    cut = int(TRIM * len(lr))
    return {
        "rel_mean": float((ma - mb) / ma),
        "log_ratio": float(np.mean(lr)),
        "trimmed": float(np.mean(lr[cut : len(lr) - cut] if cut else lr)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workflows", type=int, default=600)
    ap.add_argument("--replays", type=int, default=8)
    ap.add_argument("--shift", type=float, default=-0.4)
    ap.add_argument("--warmup", type=int, default=None, help="warm-up workflows (default: setting)")
    ap.add_argument("--baseline", action="store_true", help="heft_history as the champion")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    champion: Scheduler = HeftHistory() if args.baseline else load_bundle(CHAMPION, "v1")
    others = {
        "variant": ShiftedReservation(champion, "cpu", args.shift, "variant"),
        "copy": ShiftedReservation(champion, "cpu", 0.0, "copy"),
    }
    cfg = replace(config_from(s.evaluator.replay), replays=args.replays)
    if args.warmup is not None:
        cfg = replace(cfg, warmup_workflows=args.warmup)
    n, seed = args.workflows, args.seed
    sc0 = replace(s.sim, workload=replace(s.sim.workload, workflows=n), shift=None)
    sc = replace(sc0, shift=replace(s.sim.shift, at_s=shift_time(sc0, seed, n, 0.1),
                                    release_every=0.0))  # fmt: skip

    def recorded(sched: Scheduler) -> list[Any]:
        rec = TrafficRecorder.of(cfg)
        return record_run(
            lambda wfs, hook: Simulator(sc, wfs, seed=seed, on_outcome=hook),
            SchedulerPolicy(sched), rec, workload(sc, seed, n),
        )  # fmt: skip

    wins = recorded(champion)
    truth = {w.index: w for w in recorded(others["variant"])}
    rows = []
    for w in wins:
        world = w.world(sc)
        plays: dict[str, list[ReplayResult]] = {}
        for name, sched in [("champion", champion), *others.items()]:
            plays[name] = [
                play(world, SchedulerPolicy(sched), replay_seed(cfg.seed, w.index, k))
                for k in range(args.replays)
            ]
        t = truth.get(w.index)
        row: dict[str, Any] = {
            "window": w.index,
            "warmup": len(w.warmup),
            "whole_rel_mean": (w.mean_jct_s - t.mean_jct_s) / w.mean_jct_s if t else None,
        }
        for name in others:
            row[name] = [metrics(a, b) for a, b in zip(plays["champion"], plays[name], strict=True)]
        rows.append(row)
        print(f"window {w.index} done, {time.perf_counter() - t0:.0f} s", flush=True)
    print_table(rows)
    tag = "" if args.warmup is None else f"_warmup{args.warmup}"
    out = args.out or Path(f"experiments/results/replay_metric_noise{tag}_seed{seed}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "config": {k: str(v) for k, v in vars(args).items()},
                "windows": rows,
                "wall_s": time.perf_counter() - t0,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


def print_table(use: list[dict[str, Any]]) -> None:
    print(
        "whole-run truth by window:",
        " ".join(f"{r['whole_rel_mean']:+.3f}" for r in use if r["whole_rel_mean"] is not None),
    )
    for m in ("rel_mean", "log_ratio", "trimmed"):
        for name in ("variant", "copy"):
            per = [[d[m] for d in r[name]] for r in use]
            means = np.array([np.mean(p) for p in per])
            within = float(np.mean([np.std(p, ddof=1) for p in per]))
            sd_w = float(np.std(means, ddof=1)) if len(means) > 1 else float("nan")
            tstat = means.mean() / (sd_w / np.sqrt(len(means))) if len(means) > 1 else float("nan")
            print(
                f"{m:9s} {name:7s} windows {' '.join(f'{x:+.3f}' for x in means)}  "
                f"within-SD {within:.3f}  between-SD {sd_w:.3f}  t {tstat:+.2f}"
            )


if __name__ == "__main__":
    main()
