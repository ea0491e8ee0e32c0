"""The interference case through the replay judge: the variant of `bench/ab_interference.py`
(the champion's CPU reservation moved by `--shift` in logit space; worth +0.086 speed to the
whole cluster, invisible to a 50/50 A/B) against the champion, and an identical copy (A/A).

Per seed, the champion serves `--workflows` workflows of the `shift` profile (shift at
`--shift-at` of the arrivals; without the families' releases unless `--release-every`, as
in `bench/ab_interference.py`: with releases every 200 the variant is 9-10% slower on the
whole cluster) in the simulator while a `TrafficRecorder` records what the
evaluator would see (arrivals, heartbeats, attempt ends, the per-family history). Each
closed window is judged as the evaluator judges it (`ReplayJudge`: K replays per version
with common random numbers, fidelity first, then the paired mSPRT). Reported: the
whole-cluster effect (the variant serving everything, as `ab_interference`), the first
verdict and after how many workflows, each window's fidelity, and the A/A verdicts.

The copy is the variant's path with a zero shift: its reservations go through the same
logit round trip and differ from the champion's by float error only. On a loaded cluster
that is enough for the replays to diverge by several percent per replay, so the A/A tests
the judge against changes worth nothing, which is harder than a bit-identical copy (that
one replays identically under common random numbers and can never be promoted).

    .venv/bin/python bench/replay_interference.py [--quick] [--json] [--seeds 2] [--first-seed 0]
        [--workflows 500] [--replays K] [--warmup N] [--window 100] [--shift -0.4]
        [--max-jct-err 0.15] [--baseline] [--out DIR]

`--baseline` plays heft_history as the champion (fast; the variant shifts its reservation
the same way). Writes replay_interference.json and .png under --out (bench/results).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from online_shift import CHAMPION, interference_world_arg, shift_time, workload
from rich.console import Console
from rich.table import Table

from dagsched.core.heft import HeftHistory
from dagsched.core.scheduler import Scheduler
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    ReplayJudge,
    ReplayJudgeConfig,
    TrafficRecorder,
    config_from,
)
from dagsched.learner.variants import ShiftedReservation
from dagsched.policy.bundle import load_bundle
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import PolicyFactory
from dagsched.sim.snapshot import SchedulerPolicy


def whole(sc: ScenarioConfig, seed: int, n: int, sched: Scheduler) -> dict[str, float]:
    out = Simulator(sc, workload(sc, seed, n), seed=seed).run(SchedulerPolicy(sched))
    return {"mean_jct_s": out["mean_jct_s"], "sla": out["sla_attainment"]}


def judge_seed(
    sc: ScenarioConfig, seed: int, n: int, champion: Scheduler, others: dict[str, Scheduler],
    cfg: ReplayJudgeConfig,
) -> dict[str, Any]:  # fmt: skip
    """Record the champion's run; judge every window for each of `others`."""
    rec = TrafficRecorder.of(cfg)
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=seed, on_outcome=hook),
        SchedulerPolicy(champion), rec, workload(sc, seed, n),
    )  # fmt: skip
    out: dict[str, Any] = {"windows": len(wins)}

    def served(sched: Scheduler) -> PolicyFactory:
        return lambda _seed: SchedulerPolicy(sched)

    for name, other in others.items():
        judge = ReplayJudge(cfg, sc)
        first = None
        reports = []
        for w in wins:
            r = judge.judge(w, served(champion), served(other))
            reports.append(r)
            if first is None and r.decision in ("promote", "retire"):
                first = {"decision": r.decision, "workflows": (w.index + 1) * cfg.window_workflows,
                         "reason": r.reason}  # fmt: skip
        last = judge.test.verdict()
        out[name] = {
            "first_verdict": first,
            "windows": [
                {
                    "window": r.window,
                    "decision": r.decision,
                    "jct_err": r.fidelity.jct_err,
                    "sla_err": r.fidelity.sla_err,
                    "diffs": r.diffs,
                }
                for r in reports
            ],
            "stats": {
                m: {"diff": s.diff, "lower": s.lower, "upper": s.upper}
                for m, s in last.stats.items()
            },
        }
    return out


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for r in doc["seeds"]:
        for ax, name in zip(axes, ("variant", "copy"), strict=True):
            d = [x["jct"] for w in r[name]["windows"] for x in w["diffs"]]
            ax.plot(range(1, len(d) + 1), d, ".", label=f"seed {r['seed']}")
            ax.set_title(f"{name}: per-replay relative JCT reduction")
            ax.set_xlabel("replay")
            ax.axhline(0, color="gray", lw=0.8)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed, K=4, warm-up 100")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first-seed, first-seed+1, ...")
    ap.add_argument("--workflows", type=int, default=500)
    ap.add_argument("--replays", type=int, help="K per version per window (default: the judge's)")
    ap.add_argument("--warmup", type=int, help="arrivals replayed first (default: the judge's)")
    ap.add_argument("--window", type=int, default=100)
    ap.add_argument("--shift-at", type=float, default=0.1)
    interference_world_arg(ap)
    ap.add_argument("--shift", type=float, default=-0.4)
    ap.add_argument("--max-jct-err", type=float, default=0.15)
    ap.add_argument("--baseline", action="store_true", help="heft_history as the champion")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.replays, args.warmup = 1, 4, 100
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    champion: Scheduler = HeftHistory() if args.baseline else load_bundle(CHAMPION, "v1")
    variant = ShiftedReservation(champion, "cpu", args.shift, "variant")
    copy = ShiftedReservation(champion, "cpu", 0.0, "copy")
    judge = config_from(s.evaluator.replay)
    if args.warmup is None:
        args.warmup = judge.warmup_workflows
    if args.replays is None:
        args.replays = judge.replays
    cfg = replace(
        judge, window_workflows=args.window, warmup_workflows=args.warmup,
        replays=args.replays, fidelity_max_jct_err=args.max_jct_err,
    )  # fmt: skip
    rows = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        sc0 = replace(s.sim, workload=replace(s.sim.workload, workflows=args.workflows), shift=None)
        at = shift_time(sc0, seed, args.workflows, args.shift_at)
        sc = replace(sc0, shift=replace(s.sim.shift, at_s=at, release_every=args.release_every))
        a, b = whole(sc, seed, args.workflows, champion), whole(sc, seed, args.workflows, variant)
        row = {"seed": seed, "whole_champion": a, "whole_variant": b}
        row |= judge_seed(
            sc, seed, args.workflows, champion, {"variant": variant, "copy": copy}, cfg
        )
        rows.append(row)
    doc = {"config": vars(args) | {"out": str(args.out)}, "seeds": rows,
           "wall_s": round(time.perf_counter() - t0, 1)}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "replay_interference.json").write_text(json.dumps(to_jsonable(doc), indent=1))
    plot(doc, args.out / "replay_interference.png")
    if args.json:
        print(json.dumps(to_jsonable(doc)))
        return
    t = Table(title=f"cpu {args.shift:+g}: the replay judge on the interference case")
    for col in ("seed", "JCT whole (var/champ)", "variant: first verdict", "variant JCT diff [CS]",
                "copy: first verdict", "fidelity JCT err by window"):  # fmt: skip
        t.add_column(col, justify="right")
    for r in rows:
        v, c = r["variant"], r["copy"]
        fv = v["first_verdict"]
        fc = c["first_verdict"]
        st = v["stats"]["jct"]
        t.add_row(
            str(r["seed"]),
            f"{r['whole_variant']['mean_jct_s'] / r['whole_champion']['mean_jct_s'] - 1:+.1%}",
            "none" if fv is None else f"{fv['decision']} at {fv['workflows']}",
            f"{st['diff']:+.3f} [{st['lower']:+.3f}, {st['upper']:+.3f}]",
            "none" if fc is None else f"{fc['decision']} at {fc['workflows']}",
            " ".join(
                "n/a" if w["jct_err"] is None else f"{w['jct_err']:.0%}" for w in v["windows"]
            ),
        )
    Console().print(t)
    print(f"wall {doc['wall_s']} s; {args.out / 'replay_interference.png'}")


if __name__ == "__main__":
    main()
