"""Train without a registry and export a bundle: for a machine that has torch but no MLflow
or broker (a lent GPU box). Same training as `dagsched train`, same held-out evaluation;
prints one JSON object (timing, device, evaluation) and writes it next to the bundle.

    python experiments/train_export.py --minutes 7 --seed 2 --out OUT/champ [--device cuda]

Register the bundle afterwards where MLflow is: `dagsched models register OUT/champ`, or copy
it to models/champion.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from dagsched.learner.pipeline import held_out_eval
from dagsched.learner.train import train
from dagsched.policy.bundle import save_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.service_config import TrainSettings
from dagsched.sim.config import ScenarioConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=None)
    ap.add_argument("--updates", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warm-start", default="heft_history")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--eval-workflows", type=int, default=60)
    ap.add_argument("--lr", type=float, default=None, help="train.learning_rate")
    ap.add_argument("--epochs", type=int, default=None, help="train.update_epochs")
    ap.add_argument("--ent-coef", type=float, default=None, help="train.ent_coef")
    ap.add_argument("--target-kl", type=float, default=None, help="train.target_kl")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    if args.minutes is None and args.updates is None:
        ap.error("give --minutes or --updates")
    device = torch.device(args.device)
    scenario = ScenarioConfig()
    started = time.perf_counter()
    overrides = {
        k: v
        for k, v in (
            ("learning_rate", args.lr),
            ("update_epochs", args.epochs),
            ("ent_coef", args.ent_coef),
            ("target_kl", args.target_kl),
        )
        if v is not None
    }
    hp = TrainSettings(**overrides)
    result = train(
        scenario,
        hp,
        updates=args.updates,
        minutes=args.minutes,
        seed=args.seed,
        warm_start=None if args.warm_start == "none" else args.warm_start,
        device=device,
        on_update=lambda u, _t: print(f"update {u}", flush=True) if u % 10 == 0 else None,
    )
    trained_s = time.perf_counter() - started
    sched = GNNScheduler(result.model, result.normalizer, "candidate")
    metrics = held_out_eval(scenario, sched, args.eval_workflows)
    save_bundle(args.out, result.model, result.normalizer)
    report = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
        "seed": args.seed,
        "hyper": hp.model_dump(),
        "updates": result.updates,
        "decisions": result.decisions,
        "train_s": round(trained_s, 1),
        "wall_s": round(time.perf_counter() - started, 1),
        **metrics,
    }
    (args.out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
