"""PPO tries from the heft_history warm start: train with TrainSettings overrides (and,
optionally, other reward weights for training), then evaluate like `dagsched eval` on
held-out seeds at loads 0.8 and 0.95 against heft_history_srpt (the policy's base) and FIFO
heft_history; optionally with exact truth too.

    python experiments/ppo_tries.py --minutes 15 --seed 4 --set critic_warmup_updates=20 \\
        --set reward_norm=true --label warmup --out OUT/tries
    python experiments/ppo_tries.py --eval-only models/champion --label champion --out OUT/tries

Prints one table and writes `OUT/<label>.json` (settings, training curve, rows) and, for a
trained model, the bundle in `OUT/<label>/`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dagsched.learner.offline_eval import evaluate, make_policies, scenarios
from dagsched.learner.train import train
from dagsched.policy.bundle import load_bundle, save_bundle
from dagsched.policy.model import ActorCritic
from dagsched.policy.scheduler import GNNScheduler
from dagsched.service_config import TrainSettings
from dagsched.sim.config import RewardWeights, ScenarioConfig, TruthConfig

LOADS = (0.8, 0.95)


def _kv(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def eval_rows(sched: GNNScheduler, seeds: int, workflows: int, exact: bool) -> list[dict[str, Any]]:
    """Rows of the model, heft_history and heft_history_srpt at loads 0.8 and 0.95 (and `exact`)."""
    base = ScenarioConfig()
    keep = {f"load:{load}" for load in LOADS}
    cases = [c for c in scenarios(base, workflows, (), LOADS) if c.name in keep]
    if exact:
        ex = replace(base, truth=TruthConfig(exact=True))
        cases += [
            replace(c, name=f"exact:{c.name}")
            for c in scenarios(ex, workflows, (), LOADS)
            if c.name in keep
        ]
    policies = make_policies(["model", "heft_history", "heft_history_srpt"], sched, "model", 1)
    return evaluate(cases, policies, seeds)


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per scenario: the model against heft_history_srpt (its base, the best baseline) and
    FIFO heft_history."""
    by = {(r["scenario"], r["policy"]): r for r in rows}
    out = []
    for sc in dict.fromkeys(r["scenario"] for r in rows):
        m, hh, h = by[(sc, "model")], by[(sc, "heft_history_srpt")], by[(sc, "heft_history")]
        out.append(
            {
                "scenario": sc,
                "model_sla": m["sla_attainment"],
                "hh_sla": hh["sla_attainment"],
                "model_jct": m["mean_jct_s"],
                "hh_jct": hh["mean_jct_s"],
                "fifo_jct": h["mean_jct_s"],
                "jct_vs_hh": m["mean_jct_s"] / hh["mean_jct_s"] - 1,
                "jct_vs_fifo": m["mean_jct_s"] / h["mean_jct_s"] - 1,
                "cost_vs_hh": m["cost_core_s"] / hh["cost_core_s"] - 1,
                "model_oom": m["oom_kills"],
            }
        )
    return out


def curve(history: list[dict[str, float]]) -> dict[str, Any]:
    """The training curve in tenths: mean of each metric over each tenth of the updates."""
    if not history:
        return {}
    keys = sorted({k for h in history for k in h})
    tenths = np.array_split(np.arange(len(history)), min(10, len(history)))
    return {
        k: [
            round(float(np.mean([history[i][k] for i in part if k in history[i]])), 4)
            for part in tenths
            if any(k in history[i] for i in part)
        ]
        for k in keys
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--updates", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--set", action="append", default=[], help="TrainSettings key=value")
    ap.add_argument("--reward", action="append", default=[], help="training reward weight k=v")
    ap.add_argument("--imitation-epochs", type=int, default=4)
    ap.add_argument("--warm-start", default=None, help="imitate this heuristic first")
    ap.add_argument("--imitation-episodes", type=int, default=8)
    ap.add_argument("--eval-only", type=Path, default=None, help="a bundle to evaluate")
    ap.add_argument("--eval-seeds", type=int, default=4)
    ap.add_argument("--eval-workflows", type=int, default=60)
    ap.add_argument("--exact", action="store_true", help="evaluate with exact truth too")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument(
        "--snapshot-every-min", type=float, default=0, help="evaluate checkpoints this often"
    )
    ap.add_argument("--resume-from", default=None, help="continue this label's checkpoint")
    ap.add_argument("--label", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    started = time.perf_counter()
    doc: dict[str, Any] = {"label": args.label, "commit": commit}
    if args.eval_only is not None:
        sched = load_bundle(args.eval_only, args.label)
        doc["bundle"] = str(args.eval_only)
    else:
        if args.minutes is None and args.updates is None:
            ap.error("give --minutes or --updates")
        hp = TrainSettings(**_kv(args.set))
        scenario = ScenarioConfig()
        if args.reward:
            scenario = replace(scenario, reward=replace(RewardWeights(), **_kv(args.reward)))
        ckpt = args.out / f"{args.label}.ckpt"
        if args.resume_from is not None:
            shutil.copy(args.out / f"{args.resume_from}.ckpt", ckpt)
        else:
            ckpt.unlink(missing_ok=True)
        snaps: list[Path] = []
        last_snap = [time.perf_counter()]

        def on_update(u: int, _total: int | None) -> None:
            if u % 20 == 0:
                print(f"update {u}", flush=True)
            every = args.snapshot_every_min * 60
            if every and time.perf_counter() - last_snap[0] > every and ckpt.exists():
                last_snap[0] = time.perf_counter()
                snaps.append(args.out / f"{args.label}.snap{len(snaps)}")
                shutil.copy(ckpt, snaps[-1])

        result = train(
            scenario,
            hp,
            updates=args.updates,
            minutes=args.minutes,
            seed=args.seed,
            checkpoint=ckpt,
            imitation_epochs=args.imitation_epochs,
            warm_start=args.warm_start,
            imitation_episodes=args.imitation_episodes,
            device=torch.device("cpu"),
            on_update=on_update,
        )
        sched = GNNScheduler(result.model, result.normalizer, args.label)
        save_bundle(args.out / args.label, result.model, result.normalizer)
        doc.update(
            {
                "seed": args.seed,
                "resumed_from": args.resume_from,
                "settings": _kv(args.set),
                "reward": _kv(args.reward),
                "imitation_epochs": args.imitation_epochs,
                "imitation_episodes": args.imitation_episodes,
                "updates": result.updates,
                "decisions": result.decisions,
                "train_s": round(result.wall_s, 1),
                "curve": curve(result.history),
            }
        )
        doc["snapshots"] = []
        for snap in snaps:
            state = torch.load(snap, weights_only=False)
            model = ActorCritic(result.model.cfg)
            model.load_state_dict(state["model"])
            s_rows = eval_rows(
                GNNScheduler(model, state["normalizer"], "snap"),
                args.eval_seeds,
                args.eval_workflows,
                False,
            )
            doc["snapshots"].append({"update": state["update"], "summary": summary(s_rows)})
    rows = eval_rows(sched, args.eval_seeds, args.eval_workflows, args.exact)
    doc["summary"] = summary(rows)
    doc["rows"] = rows
    doc["wall_s"] = round(time.perf_counter() - started, 1)
    (args.out / f"{args.label}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{args.label} (commit {commit}, {doc.get('train_s', 0)} s training)")
    for s in doc["summary"]:
        print(
            f"  {s['scenario']:>18}  SLA {s['model_sla']:.3f} vs srpt {s['hh_sla']:.3f}  "
            f"JCT {s['model_jct']:.0f} vs srpt {s['hh_jct']:.0f} ({s['jct_vs_hh']:+.1%}; "
            f"vs fifo {s['jct_vs_fifo']:+.1%})  cost {s['cost_vs_hh']:+.1%}  "
            f"oom {s['model_oom']:.1f}"
        )
    for snap in doc.get("snapshots", []):
        print(
            f"  snapshot at update {snap['update']}: "
            + "; ".join(
                f"{s['scenario']} JCT {s['jct_vs_hh']:+.1%} SLA {s['model_sla']:.3f}"
                for s in snap["summary"]
            )
        )
    for k in (
        "losses/approx_kl",
        "losses/value_loss",
        "losses/warmup_value_loss",
        "losses/explained_variance",
        "charts/mean_reward",
    ):
        if k in doc.get("curve", {}):
            print(f"  {k}: {doc['curve'][k]}")


if __name__ == "__main__":
    main()
