"""The fine-tuning flags that `experiments/shift_gap.py` (offline) and `bench/online_shift.py` (the
loop) share, and the `FinetuneConfig` they make: one definition, so the two benches tune the
same knobs under the same names."""

from __future__ import annotations

import argparse

from dagsched.learner.online import FinetuneConfig


def add_finetune_args(ap: argparse.ArgumentParser, lr: float, credit: str = "task") -> None:
    """--lr (default `lr`), --epochs, --target-kl, --ent-coef, --clip, --credit (default
    `credit`)."""
    ap.add_argument("--lr", type=float, default=lr)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--target-kl", type=float, default=0.2)
    ap.add_argument("--ent-coef", type=float, default=0.01, help="entropy bonus of PPO")
    ap.add_argument("--clip", type=float, default=0.2, help="PPO's ratio clip")
    ap.add_argument("--credit", default=credit, choices=("task", "task-critic", "attempt"))


def finetune_config(args: argparse.Namespace) -> FinetuneConfig:
    """The `FinetuneConfig` of the flags `add_finetune_args` declared."""
    return FinetuneConfig(
        learning_rate=args.lr,
        update_epochs=args.epochs,
        target_kl=args.target_kl,
        credit=args.credit,
        ent_coef=args.ent_coef,
        clip_coef=args.clip,
    )
