"""Drift: SLA attainment over simulated time, the champion alone against the full loop.

Each seed plays one workload (default scenario from the settings: 32 nodes, load 0.8, faults
on) twice: served by the shipped champion alone, and by the learning loop played in the
simulator (`dagsched.learner.sim_loop`: champion/challenger split, head fine-tuning every N
attempts, the sequential A/B evaluator). At `--drift-at-min` a quarter of the nodes turn 3x
slower with 5x the node and task failure rates, unannounced.

SLA over time: a workflow counts in the 10-minute bucket where its outcome became known —
when it finished in time (met); when it failed, finished late, or reached its deadline still
running (missed), whichever came first. Workflows still in flight before their deadline at
the end are not counted. Buckets pool every seed (met / counted).

Recovery: the loop's pre-drift SLA is P; after the first bucket below 0.95 P, recovery is the
end of the first bucket from which every later bucket stays >= 0.95 P (sustained); the first
bucket back >= 0.95 P is reported too. Prints a table, writes drift.json and drift.png.

    .venv/bin/python bench/drift.py [--seeds 3] [--hours 3] [--drift-at-min 60] [--out DIR]
        [--share S] [--every-n N] [--window W] [--min-samples M] [--target-kl K]
        [--replace-challenger]

Defaults are the service defaults (`load_settings()`): 10% share, a round every 1,000
attempts, one challenger under test at a time, 100 workflows per arm before any verdict.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch
from harness.results import write_results
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from dagsched.core.workflow import Workflow
from dagsched.learner.online import FinetuneConfig
from dagsched.learner.sim_loop import LoopConfig, LoopEvent, SimLoop, WorkflowResult
from dagsched.policy.bundle import load_bundle
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import DriftConfig, ScenarioConfig
from dagsched.sim.runner import stream_workflows

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"
ARMS = ("champion alone", "full loop")


def workload(sc: ScenarioConfig, seed: int, horizon_s: float) -> Iterator[Workflow]:
    """The seed's workflows arriving before the horizon, generated lazily."""
    return itertools.takewhile(lambda w: w.arrival_s < horizon_s, stream_workflows(sc, seed, 10**6))


def play(
    sc: ScenarioConfig, seed: int, horizon_s: float, cfg: LoopConfig
) -> tuple[list[WorkflowResult], list[LoopEvent], float]:
    """One run to the horizon: every arrived workflow, the loop's events, wall seconds."""
    t0 = time.perf_counter()
    loop = SimLoop(load_bundle(CHAMPION, "v1"), cfg, seed=seed)
    sim = loop.simulator(sc, workload(sc, seed, horizon_s), seed)
    results = loop.run(sim, until=horizon_s)
    return results, loop.events, time.perf_counter() - t0


def settled(results: Sequence[WorkflowResult], horizon_s: float) -> list[tuple[float, bool]]:
    """(time the SLA outcome became known, met) per workflow whose outcome is known."""
    out = []
    for w in results:
        if w.end_s is not None and w.met:
            out.append((w.end_s, True))
        elif w.end_s is not None:
            out.append((min(w.end_s, w.due_s), False))
        elif w.due_s <= horizon_s:
            out.append((w.due_s, False))
    return out


def buckets(points: Sequence[tuple[float, bool]], horizon_s: float, width_s: float) -> list[dict]:
    """Per bucket: start minute, workflows counted, met, SLA (None when empty)."""
    n = int(horizon_s // width_s)
    counted, met = [0] * n, [0] * n
    for at, ok in points:
        b = min(int(at // width_s), n - 1)
        counted[b] += 1
        met[b] += ok
    return [
        {
            "start_min": b * width_s / 60,
            "n": counted[b],
            "met": met[b],
            "sla": met[b] / counted[b] if counted[b] else None,
        }
        for b in range(n)
    ]


def by_arm(results: Sequence[WorkflowResult], drift_s: float, horizon_s: float) -> dict:
    """Workflows arriving after the drift, by the arm that decided their first task."""
    out: dict[str, dict[str, float]] = {}
    for w in results:
        known = w.end_s is not None or w.due_s <= horizon_s
        if w.arrival_s >= drift_s and known and w.arm:
            d = out.setdefault(w.arm, {"n": 0, "met": 0})
            d["n"] += 1
            d["met"] += w.met
    return {arm: {**d, "sla": d["met"] / d["n"]} for arm, d in out.items()}


def sla_between(points: Sequence[tuple[float, bool]], lo: float, hi: float) -> float | None:
    sel = [ok for at, ok in points if lo <= at < hi]
    return sum(sel) / len(sel) if sel else None


def recovery(series: list[dict], drift_s: float, target: float, width_s: float) -> dict:
    """Minutes after the drift of the first dip, first return and sustained return."""
    after = [b for b in series if b["start_min"] * 60 >= drift_s and b["sla"] is not None]
    dip = next((i for i, b in enumerate(after) if b["sla"] < target), None)
    if dip is None:
        return {"dipped": False, "first_back_min": 0.0, "sustained_min": 0.0}
    rest = after[dip:]
    first = next((b for b in rest if b["sla"] >= target), None)
    sustained = None
    for i, b in enumerate(rest):
        if all(x["sla"] >= target for x in rest[i:]):
            sustained = b
            break
    end = lambda b: None if b is None else b["start_min"] + width_s / 60 - drift_s / 60  # noqa: E731
    return {
        "dipped": True,
        "dip_min": after[dip]["start_min"] - drift_s / 60,
        "first_back_min": end(first),
        "sustained_min": end(sustained),
    }


def plot(path: Path, series: dict[str, list[dict]], events: list[dict], doc: dict) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    width = doc["config"]["bucket_min"]
    for arm, color in zip(ARMS, ("tab:gray", "tab:blue"), strict=True):
        xs = [b["start_min"] + width / 2 for b in series[arm] if b["sla"] is not None]
        ys = [b["sla"] for b in series[arm] if b["sla"] is not None]
        ax.plot(xs, ys, marker="o", ms=3, color=color, label=arm)
    ax.axvline(doc["config"]["drift_at_min"], color="tab:red", ls="--", label="drift")
    target = doc["summary"]["recovery_target"]
    if target is not None:
        ax.axhline(target, color="tab:green", ls=":", label="95% of pre-drift SLA (loop)")
    marks = {"promote": ("^", "tab:green"), "rollback": ("v", "tab:red"), "retire": ("x", "k")}
    for kind, (m, c) in marks.items():
        at = [e["at_min"] for e in events if e["kind"] == kind]
        if at:
            ax.scatter(at, [0.02] * len(at), marker=m, color=c, s=40, label=f"{kind} (any seed)")
    rounds = [e["at_min"] for e in events if e["kind"] == "round"]
    if rounds:
        label = "learner round (any seed)"
        ax.scatter(rounds, [0.0] * len(rounds), marker="|", color="tab:blue", s=60, label=label)
    ax.set_ylim(-0.03, 1.05)
    ax.set_xlabel("simulated minutes")
    ax.set_ylabel(f"SLA attainment ({width:g}-min buckets, seeds pooled)")
    c = doc["config"]
    ax.set_title(
        f"drift: {c['drift']['node_share']:.0%} of nodes {c['drift']['slowdown']:g}x slower, "
        f"failures x{c['drift']['failure_mult']:g}; {c['seeds']} seed(s), share {c['share']:g}, "
        f"every {c['every_n']} attempts"
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left", fontsize=8)
    fig.savefig(path, dpi=120)


def main() -> None:
    s = load_settings()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--hours", type=float, default=3.0, help="simulated hours per run")
    ap.add_argument("--drift-at-min", type=float, default=60.0)
    ap.add_argument("--every-n", type=int, default=s.learner.every_n_tasks)
    ap.add_argument("--share", type=float, default=s.daemon.challenger_share)
    ap.add_argument("--window", type=int, default=s.learner.window)
    ap.add_argument("--lr", type=float, default=s.learner.learning_rate)
    ap.add_argument("--epochs", type=int, default=s.learner.update_epochs)
    ap.add_argument("--target-kl", type=float, default=s.learner.target_kl, help="to the champion")
    ap.add_argument("--min-samples", type=int, default=s.evaluator.min_samples)
    ap.add_argument(
        "--replace-challenger",
        action="store_true",
        default=s.learner.replace_challenger,
        help="every round replaces the challenger under test (learner.replace_challenger)",
    )
    ap.add_argument("--bucket-min", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    horizon, drift_s, width = args.hours * 3600, args.drift_at_min * 60, args.bucket_min * 60
    drift = DriftConfig(at_s=drift_s)
    sc = replace(s.sim, drift=drift)
    ft = replace(
        FinetuneConfig(),
        learning_rate=args.lr,
        update_epochs=args.epochs,
        target_kl=args.target_kl,
    )
    # the A/B evaluator this bench was measured with (the replay judge: bench/online_shift.py)
    ev = s.evaluator.model_copy(update={"min_samples": args.min_samples, "judge": "ab"})
    loop_cfg = LoopConfig(
        True, args.share, args.every_n, args.window, args.replace_challenger, ft, ev
    )
    configs = {ARMS[0]: replace(loop_cfg, learn=False), ARMS[1]: loop_cfg}

    points: dict[str, list[tuple[float, bool]]] = {arm: [] for arm in ARMS}
    events: list[dict[str, Any]] = []
    per_seed: list[dict[str, Any]] = []
    runs = [(seed, arm) for seed in range(args.seeds) for arm in ARMS]
    for seed, arm in tqdm(runs, desc="drift runs", unit="run"):
        results, evs, wall = play(sc, seed, horizon, configs[arm])
        pts = settled(results, horizon)
        points[arm] += pts
        kinds = [e.kind for e in evs]
        per_seed.append(
            {
                "seed": seed,
                "arm": arm,
                "wall_s": round(wall, 1),
                "workflows": len(results),
                "sla_pre": sla_between(pts, 0, drift_s),
                "sla_post": sla_between(pts, drift_s, horizon),
                "sla_final_hour": sla_between(pts, horizon - 3600, horizon),
                **{k: kinds.count(k) for k in ("round", "promote", "retire", "rollback")},
                "post_drift_by_serving_arm": by_arm(results, drift_s, horizon),
            }
        )
        for e in evs:
            stats = e.detail.get("stats", {})
            events.append(
                {
                    "seed": seed,
                    "at_min": round(e.at_s / 60, 2),
                    "kind": e.kind,
                    "version": e.version,
                    "champion": e.champion,
                    "reason": e.detail.get("reason"),
                    "stats": stats,
                    "metrics": {k: v for k, v in e.detail.items() if k not in ("stats", "rule")},
                }
            )

    series = {arm: buckets(points[arm], horizon, width) for arm in ARMS}
    pre = sla_between(points[ARMS[1]], 0, drift_s)
    target = 0.95 * pre if pre is not None else None
    rec = recovery(series[ARMS[1]], drift_s, target, width) if target is not None else {}
    final = {arm: sla_between(points[arm], horizon - 3600, horizon) for arm in ARMS}
    post = {arm: sla_between(points[arm], drift_s, horizon) for arm in ARMS}
    pre_arm = {arm: sla_between(points[arm], 0, drift_s) for arm in ARMS}
    kinds = [e["kind"] for e in events]
    counts = {k: kinds.count(k) for k in ("round", "promote", "retire", "rollback")}
    sustained = rec.get("sustained_min")
    fc, fl = final[ARMS[0]], final[ARMS[1]]
    summary = {
        "pre_drift_sla_loop": pre,
        "recovery_target": target,
        **{f"recovery_{k}": v for k, v in rec.items()},
        "recovered_within_30_min": sustained is not None and sustained <= 30,
        "final_hour_sla": final,
        "final_hour_sla_per_seed": {
            arm: [r["sla_final_hour"] for r in per_seed if r["arm"] == arm] for arm in ARMS
        },
        "post_drift_sla": post,
        "pre_drift_sla": pre_arm,
        "loop_ends_above_champion": fl is not None and fc is not None and fl > fc,
        "rounds": counts["round"],
        "promotions": counts["promote"],
        "retirements": counts["retire"],
        "rollbacks": counts["rollback"],
        "wall_s": round(sum(r["wall_s"] for r in per_seed), 1),
    }
    doc = {
        "config": {
            "seeds": args.seeds,
            "hours": args.hours,
            "drift_at_min": args.drift_at_min,
            "bucket_min": args.bucket_min,
            "drift": asdict(drift),
            "load": sc.workload.load,
            "nodes": sc.cluster.n_nodes,
            "share": args.share,
            "every_n": args.every_n,
            "window": args.window,
            "replace_challenger": args.replace_challenger,
            "finetune": asdict(ft),
            "evaluator": ev.model_dump(),
            "bucketing": "by the time each workflow's SLA outcome became known; seeds pooled",
        },
        "summary": summary,
        "series": series,
        "runs": per_seed,
        "events": events,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_results(args.out / "drift.json", to_jsonable(doc))
    plot(args.out / "drift.png", series, events, doc)

    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    table = Table(
        title=f"drift at {args.drift_at_min:g} min, {args.seeds} seed(s), {args.hours:g} h"
    )
    for col in ("", *ARMS):
        table.add_column(col, justify="right" if col else "left")
    table.add_row("SLA before the drift", *(f(pre_arm[a]) for a in ARMS))
    table.add_row("SLA after the drift", *(f(post[a]) for a in ARMS))
    table.add_row("SLA final hour", *(f(final[a]) for a in ARMS))
    per = summary["final_hour_sla_per_seed"]
    table.add_row("  per seed", *(" ".join(f(x) for x in per[a]) for a in ARMS))
    mins = lambda v: "never" if v is None else f"{v:g} min"  # noqa: E731
    table.add_row("first back >= 95% pre", "", mins(rec.get("first_back_min")))
    table.add_row("sustained >= 95% pre", "", mins(sustained))
    table.add_row("rounds / promotions", "", f"{counts['round']} / {counts['promote']}")
    table.add_row("retirements / rollbacks", "", f"{counts['retire']} / {counts['rollback']}")
    walls = {a: sum(r["wall_s"] for r in per_seed if r["arm"] == a) for a in ARMS}
    table.add_row("wall s", *(f"{walls[a]:.0f}" for a in ARMS))
    console = Console()
    console.print(table)
    ok = summary["recovered_within_30_min"] and summary["loop_ends_above_champion"]
    console.print(
        f"target (recover to >= 95% of pre-drift SLA within 30 min and end above the champion): "
        f"{'met' if ok else 'NOT met'}; results in {args.out}/drift.json, drift.png"
    )


if __name__ == "__main__":
    main()
