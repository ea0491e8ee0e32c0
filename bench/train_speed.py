"""PPO training speed: updates and decisions per wall second, on CPU (and CUDA when present).

Runs a few PPO updates on the default training settings (4 simulators, rollout 64 each,
10 epochs of minibatch 64) after a short setup, timing only the updates. Prints a table and
writes JSON (default bench/results/train_speed.json).

    .venv/bin/python bench/train_speed.py [--updates 8] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import torch
from harness.results import write_results
from rich.console import Console
from rich.table import Table

from dagsched.learner.train import train
from dagsched.settings import load_settings


def measure(updates: int, device: str) -> dict[str, float | str]:
    s = load_settings()
    stamps: list[float] = []
    result = train(
        s.sim,
        s.train,
        updates=updates,
        seed=0,
        warm_start=None,
        imitation_episodes=2,
        device=torch.device(device),
        on_update=lambda u, total: stamps.append(time.perf_counter()),
    )
    span = stamps[-1] - stamps[0]
    timed = len(stamps) - 1  # the first update includes warm-up; time the rest
    per_update = result.decisions / result.updates
    return {
        "device": device,
        "threads": torch.get_num_threads(),
        "updates_timed": timed,
        "updates_per_s": timed / span,
        "decisions_per_s": timed * per_update / span,
        "decisions_per_update": per_update,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path("bench/results/train_speed.json"))
    args = ap.parse_args()
    row = measure(args.updates, args.device)
    t = Table(title="PPO training speed")
    for col in ("device", "threads", "updates timed", "updates/s", "decisions/s"):
        t.add_column(col, justify="right")
    t.add_row(
        str(row["device"]),
        str(row["threads"]),
        str(row["updates_timed"]),
        f"{row['updates_per_s']:.3f}",
        f"{row['decisions_per_s']:.1f}",
    )
    Console().print(t)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_results(
        args.out,
        {
            "bench": "train_speed",
            "python": platform.python_version(),
            "torch": torch.__version__,
            **row,
        },
    )


if __name__ == "__main__":
    main()
