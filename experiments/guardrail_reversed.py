"""The guardrail against a deliberately bad version promoted by hand: the champion fine-tuned
on a *reversed* reward, made champion by hand mid-run, rolled back by the judge's guardrail.

1. The champion serves `--train-workflows` of a training seed with sampled actions (the
   exploration slice's way); the learner's `finetune_heads` then takes `--rounds` rounds on
   that experience with every reward negated (each round from the last): a version that
   learned to do what the reward punishes.
2. On a fresh seed the simulator loop (`SimLoop`: judge and guardrail on, no learner rounds)
   serves the champion; when workflow `--promote-at` arrives the reversed version is
   promoted by hand (`SimLoop.promote_by_hand`, as `dagsched models promote` moves the
   champion alias with the old one as `@previous`). The guardrail compares its SLA with the
   old champion's over what each served, and rolls it back when the difference is
   significantly below 0, within `evaluator.guardrail_window` workflows or not at all.
3. Both versions are also played alone on `--eval-seeds` held-out seeds, for the table.

    .venv/bin/python experiments/guardrail_reversed.py [--profile shift] [--workflows 600]
        [--promote-at 150] [--rounds 5] [--train-workflows 100] [--eval-seeds 2]
        [--lr 5e-3] [--target-kl 1e9] [--holdback] [--judge ab] [--json]

`--holdback` promotes as the evaluator does: the old champion keeps serving the holdback
slice (`daemon.holdback_share`), and the guardrail compares with it in the same minutes.
`--judge ab` leaves the replay judge out (the guardrail is the same, the run much faster).

The defaults lift the KL limit that keeps a learner's round near its champion (0.2 in the
loop): with it, 3 reversed rounds at 2e-3 made a version only 4 SLA points worse, which the
guardrail did not tell from the champion within its window.

Writes experiments/results/guardrail_reversed.{json,png} (`--out` folder). `--copy` is the control:
the champion's own copy promoted the same way (guardrail_copy.{json,png}); exit status 1
when the bad version is not rolled back, or the copy is.
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

# the shared bench harness (and bench/online_shift.py) import as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from harness.finetune_args import add_finetune_args, finetune_config
from online_shift import CHAMPION, events_doc, held_out, workload

from dagsched.learner.online import finetune_heads
from dagsched.learner.sim_loop import LoopConfig, SimLoop, WorkflowResult
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig, ShiftConfig

TRAIN_SEED = 50_000
SERVE_SEED = 51_000
EVAL_SEED = 52_000


def scenario(profile: str, n: int) -> ScenarioConfig:
    """The profile's world with `n` workflows; its shift (if any) on from t=0."""
    sc = load_settings(profile=profile).sim
    sc = replace(sc, workload=replace(sc.workload, workflows=n))
    if sc.shift is not None:
        sc = replace(sc, shift=replace(sc.shift, at_s=0.0))
    return sc


def reversed_version(
    champion: GNNScheduler, sc: ScenarioConfig, args: argparse.Namespace
) -> tuple[GNNScheduler, list[dict[str, float]]]:
    """The champion fine-tuned for `args.rounds` rounds on its own sampled experience with
    every reward negated."""
    torch.manual_seed(TRAIN_SEED)  # the sampled actions draw from torch's generator
    explore = LoopConfig(learn=False, share=0.0, explore_share=1.0, window=10**6)
    loop = SimLoop(champion, explore, seed=TRAIN_SEED)
    loop.run(loop.simulator(sc, workload(sc, TRAIN_SEED, args.train_workflows), TRAIN_SEED))
    flipped = [replace(j, reward=-j.reward) for j in loop.window]
    model, metrics = None, []
    for r in range(args.rounds):
        result = finetune_heads(
            champion.model,
            champion.normalizer,
            flipped,
            finetune_config(args),
            seed=r,
            start=model,
        )
        model = result.model
        metrics.append(result.metrics)
    assert model is not None
    return GNNScheduler(model, champion.normalizer, "reversed"), metrics


def by_version(results: list[WorkflowResult]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for v in sorted({w.version for w in results if w.end_s is not None}):
        done = [w for w in results if w.version == v and w.end_s is not None]
        out[v] = {
            "workflows": len(done),
            "sla": float(np.mean([w.met for w in done])),
            "mean_jct_s": float(np.mean([w.end_s - w.arrival_s for w in done if w.end_s])),
        }
    return out


def plot(path: Path, results: list[WorkflowResult], events: list[dict[str, Any]], n: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = 25
    xs, sla = [], []
    for k in range(0, len(results), step):
        chunk = [w for w in results[k : k + step] if w.end_s is not None]
        if chunk:
            xs.append(k + step / 2)
            sla.append(float(np.mean([w.met for w in chunk])))
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(xs, sla, marker="o", ms=3, label=f"SLA per {step} arrivals")
    for e in events:
        if e["kind"] in ("promote", "rollback"):
            color = "tab:red" if e["kind"] == "promote" else "tab:green"
            ax.axvline(e["arrived"], color=color, ls="--", label=f"{e['kind']} {e['version']}")
    ax.set_xlim(0, n)
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("workflows arrived")
    ax.set_ylabel("SLA attainment")
    ax.set_title("a reversed-reward version promoted by hand, and the guardrail")
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="shift")
    ap.add_argument("--workflows", type=int, default=600, help="of the served run")
    ap.add_argument("--promote-at", type=int, default=150, help="arrival of the hand promotion")
    ap.add_argument("--rounds", type=int, default=5, help="reversed-reward rounds")
    ap.add_argument("--train-workflows", type=int, default=100)
    ap.add_argument("--eval-seeds", type=int, default=2)
    ap.add_argument("--eval-workflows", type=int, default=150)
    ap.add_argument("--serve-seed", type=int, default=SERVE_SEED)
    ap.add_argument(
        "--copy",
        action="store_true",
        help="the control: promote an identical copy of the champion instead (no fine-tuning)",
    )
    ap.add_argument(
        "--holdback", action="store_true", help="keep a holdback slice, as the evaluator does"
    )
    ap.add_argument("--judge", choices=("replay", "ab"), default="replay")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the summary)")
    ap.add_argument("--out", type=Path, default=Path("experiments/results"))
    add_finetune_args(ap, lr=5e-3, credit="task-critic")
    # deliberately bad: the KL limit that keeps a learner's round near its champion is lifted
    ap.set_defaults(target_kl=1e9)
    return ap.parse_args()


def main() -> int:
    args = parse()
    started = time.perf_counter()
    settings = load_settings(profile=args.profile)
    champion = load_bundle(CHAMPION, "v1")
    if args.copy:
        bad, rounds = GNNScheduler(champion.model, champion.normalizer, "copy"), []
    else:
        bad, rounds = reversed_version(champion, scenario(args.profile, args.train_workflows), args)
    seed = args.serve_seed

    sc = scenario(args.profile, args.workflows)
    at = [w.arrival_s for w in workload(sc, seed, args.workflows)][args.promote_at]
    ev = settings.evaluator.model_copy(update={"judge": args.judge})
    held_share = settings.daemon.holdback_share if args.holdback else 0.0
    cfg = LoopConfig(learn=True, every_n=10**9, share=0.0, evaluator=ev, holdback_share=held_share)
    loop = SimLoop(champion, cfg, seed=seed)
    sim = loop.simulator(sc, workload(sc, seed, args.workflows), seed)
    loop.run(sim, until=at)
    promoted = loop.promote_by_hand(bad, sim.now, by="bench (hand)", holdback=args.holdback)
    results = loop.run(sim)
    arrivals = [w.arrival_s for w in workload(sc, seed, args.workflows)]
    events = events_doc(seed, loop.events, arrivals)
    back = next((e for e in events if e["kind"] == "rollback"), None)
    served_bad = sum(1 for w in results if w.version == promoted)
    judged = back["stats"]["sla"]["n_challenger"] if back else None

    seeds = [EVAL_SEED + k for k in range(args.eval_seeds)]
    scheds: dict[str, GNNScheduler | str] = {"champion": champion}
    if not args.copy:
        scheds["reversed"] = bad
    held = held_out(settings.sim, scheds, seeds, args.eval_workflows)
    summary: dict[str, Any] = {
        "promoted": "copy of the champion" if args.copy else "reversed-reward version",
        "promoted_at_arrival": args.promote_at,
        "rolled_back": back is not None,
        "rolled_back_at_arrival": back["arrived"] if back else None,
        "workflows_to_rollback": back["arrived"] - args.promote_at if back else None,
        "reversed_version_workflows": served_bad,  # arrived while it was champion
        "judged_workflows_at_rollback": judged,  # finished ones the guardrail had seen
        "guardrail_window": settings.evaluator.guardrail_window,
        "within_window": judged is not None and judged <= settings.evaluator.guardrail_window,
        "rollback_reason": back["reason"] if back else None,
        "holdback_workflows": sum(1 for w in results if w.arm == "holdback"),
        "cleared": any(e["kind"] == "clear" for e in events),
        "held_out": held,
        "wall_s": round(time.perf_counter() - started, 1),
    }
    doc = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "shift": to_jsonable(sc.shift or ShiftConfig()),
        "summary": summary,
        "reversed_rounds": rounds,
        "by_version": by_version(results),
        "events": events,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = ("guardrail_copy" if args.copy else "guardrail_reversed") + (
        "_holdback" if args.holdback else ""
    )
    (args.out / f"{name}.json").write_text(json.dumps(to_jsonable(doc), indent=2))
    plot(args.out / f"{name}.png", results, events, args.workflows)
    if args.json:
        print(json.dumps(to_jsonable(summary)))
        return 0
    h = held
    print(
        f"held out ({len(seeds)} x {args.eval_workflows}): "
        + "; ".join(f"{k} SLA {v['sla']:.3f} / {v['mean_jct_s']:,.0f} s" for k, v in h.items())
    )
    if back is None:
        what = summary["promoted"]
        print(f"promoted {promoted} ({what}) at arrival {args.promote_at}: not rolled back")
        return 0 if args.copy else 1
    print(
        f"promoted {promoted} by hand at arrival {args.promote_at}; rolled back at arrival "
        f"{back['arrived']}: {served_bad} workflows arrived while it served, {judged} of them "
        f"finished and judged (window {settings.evaluator.guardrail_window}): {back['reason']}"
    )
    print(f"{summary['wall_s']} s; {args.out / (name + '.json')}")
    return 1 if args.copy else 0


if __name__ == "__main__":
    raise SystemExit(main())
