"""Replay judge speed: one window judged in the service's thread and in worker processes.

The champion serves `--workflows` workflows of the `shift` profile in the simulator (the
shift on from the start) while a `TrafficRecorder` records what the evaluator would see;
the last window closed is then judged as the evaluator judges it (`ReplayJudge.judge`: K
replays of the champion and K of a challenger, the champion with its memory margin moved,
common random numbers), once per worker count in `--workers`. Reported per count: the wall
time of the window, replays per second, the speed-up over one worker, and whether the
per-replay results equal one worker's (they must: a replay depends only on its world,
policy and seed). A pool's start-up (its workers importing torch) is timed apart: a service
pays it once.

    .venv/bin/python bench/replay_speed.py [--workers 1,2] [--workflows 700] [--replays 16]
        [--seed 0] [--out bench/results/replay_speed.json]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.results import write_results
from online_shift import CHAMPION, workload
from rich.console import Console
from rich.table import Table

from dagsched.learner.head_search import with_shifts
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    ObservedWindow,
    ReplayJudge,
    TrafficRecorder,
    WindowReport,
    config_from,
)
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_pool import Plays, replays_for
from dagsched.sim.replay_world import ReplayResult
from dagsched.sim.snapshot import PolicyOf, SchedulerPolicy

RESULTS = Path(__file__).resolve().parent / "results"


def recorded_window(sc: ScenarioConfig, seed: int, n: int, cfg: Any) -> ObservedWindow:
    """The last window the champion's run of `n` workflows closed."""
    champion = load_bundle(CHAMPION, "v1")
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=seed, on_outcome=hook),
        SchedulerPolicy(champion), TrafficRecorder.of(cfg), workload(sc, seed, n),
    )  # fmt: skip
    if not wins:
        raise SystemExit(f"{n} workflows closed no window of {cfg.window_workflows}: raise it")
    return wins[-1]


def _key(results: list[dict[str, float]]) -> list[tuple[float, ...]]:
    return [tuple(r.values()) for r in results]


def timed(
    workers: int, obs: ObservedWindow, sc: ScenarioConfig, cfg: Any
) -> tuple[dict[str, Any], WindowReport]:
    """One window judged with `workers` (its pool started and timed first)."""
    champion = load_bundle(CHAMPION, "v1")
    challenger = GNNScheduler(with_shifts(champion.model, {"mem": 0.4}), champion.normalizer, "v2")
    where = replays_for(workers)
    try:
        t0 = time.perf_counter()
        # start-up: each worker imports the simulator and torch and plays one tiny replay
        tiny: list[ReplayResult] = [
            r
            for got in where.play_many(
                [Plays(obs.world(sc, 0), PolicyOf(champion, "v1"), [k]) for k in range(workers)]
            )
            for r in got
        ]
        startup = time.perf_counter() - t0 if workers > 1 else 0.0
        assert len(tiny) == workers
        judge = ReplayJudge(replace(cfg, fidelity_max_jct_err=10.0), sc, replays=where)
        t0 = time.perf_counter()
        report = judge.judge(obs, PolicyOf(champion, "v1"), PolicyOf(challenger, "v2"))
        wall = time.perf_counter() - t0
    finally:
        where.close()
    plays = len(report.champion) + len(report.challenger)
    return {
        "workers": workers,
        "startup_s": round(startup, 2),
        "window_s": round(wall, 2),
        "replays": plays,
        "replays_per_s": round(plays / wall, 3),
    }, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default="1,2", help="worker counts to time, comma-separated")
    ap.add_argument("--workflows", type=int, default=700)
    ap.add_argument("--replays", type=int, default=16, help="K per version")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "replay_speed.json")
    args = ap.parse_args()
    settings = load_settings(profile="shift")
    sc = settings.sim
    cfg = replace(config_from(settings.evaluator.replay), replays=args.replays)
    console = Console(stderr=True)
    with console.status(f"recording {args.workflows} workflows of shift"):
        obs = recorded_window(sc, args.seed, args.workflows, cfg)
    rows: list[dict[str, Any]] = []
    first: WindowReport | None = None
    for w in (int(x) for x in args.workers.split(",")):
        with console.status(f"judging window {obs.index} with {w} worker(s)"):
            row, report = timed(w, obs, sc, cfg)
        first = first or report
        row["same_results"] = _key(report.champion) == _key(first.champion) and _key(
            report.challenger
        ) == _key(first.challenger)
        row["speedup"] = round(rows[0]["window_s"] / row["window_s"], 2) if rows else 1.0
        rows.append(row)
    table = Table(title=f"One window judged (window {obs.index}, K={args.replays} per version)")
    for col in ("workers", "pool start s", "window s", "replays/s", "speed-up", "same results"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["workers"]), f"{r['startup_s']:.1f}", f"{r['window_s']:.1f}",
            f"{r['replays_per_s']:.2f}", f"{r['speedup']:.2f}x", str(r["same_results"]),
        )  # fmt: skip
    Console().print(table)
    doc = {
        "config": {
            "profile": "shift",
            "workflows": args.workflows,
            "seed": args.seed,
            "replays": args.replays,
            "window": obs.index,
            "window_workflows": cfg.window_workflows,
            "warmup_workflows": cfg.warmup_workflows,
            "after_workflows": cfg.after_workflows,
            "replayed_workflows": len(obs.world(sc).workflows),
        },
        "runs": rows,
    }
    write_results(args.out, doc)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
