"""Train, evaluate on held-out seeds, export the bundle, register the version.

Reports progress through structlog and an optional `progress` callback; drawing a bar is the
caller's business (the CLI passes its `progress_bar`).
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import structlog

from dagsched.learner.train import train
from dagsched.policy.bundle import save_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.settings import Settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import simulate
from dagsched.sim.snapshot import SchedulerPolicy

log = structlog.get_logger("dagsched.train")

HELD_OUT_SEEDS = (1000, 1001, 1002)

ProgressFn = Callable[[int, int], None]
# `progress(description)` opens a context that yields a `(done, total)` callback; it is
# closed when training ends, before the held-out evaluation (0 as total: not known).
Progress = Callable[[str], AbstractContextManager[ProgressFn]]


def _no_progress(description: str) -> AbstractContextManager[ProgressFn]:
    del description
    return nullcontext(lambda done, total: None)


def held_out_eval(
    scenario: ScenarioConfig, sched: GNNScheduler, workflows: int
) -> dict[str, float]:
    """Mean SLA / JCT of the model and three baselines on seeds training never drew."""
    sc = replace(scenario, workload=replace(scenario.workload, workflows=workflows))
    out: dict[str, float] = {}
    for name, pol in (
        ("model", SchedulerPolicy(sched, "model")),
        ("heft_history", "heft_history"),
        ("heft", "heft"),
        ("least_loaded", "least_loaded"),
    ):
        runs = [simulate(sc, pol, seed=s) for s in HELD_OUT_SEEDS]
        out[f"eval/{name}_sla"] = float(np.mean([r["sla_attainment"] for r in runs]))
        out[f"eval/{name}_jct_s"] = float(np.mean([r["mean_jct_s"] for r in runs]))
        out[f"eval/{name}_reward"] = float(np.mean([r["total_reward"] for r in runs]))
    return out


def training_scenario(settings: Settings) -> ScenarioConfig:
    """`settings.sim`, with `train.deadline_slack` when set."""
    slack = settings.train.deadline_slack
    if slack is None:
        return settings.sim
    sc = settings.sim
    return replace(sc, workload=replace(sc.workload, slack=slack))


def run_training(
    settings: Settings,
    *,
    minutes: float | None,
    updates: int | None,
    seed: int,
    warm_start: str | None,
    export: Path | None,
    resume: bool,
    eval_workflows: int,
    progress: Progress = _no_progress,
    on_metrics: Callable[[dict[str, float], int], None] | None = None,
) -> dict[str, Any]:
    """The whole `dagsched train`: returns the registered version and its metrics.

    `progress` reports the PPO updates (see `Progress`); by default nothing is drawn.
    `on_metrics` gets each update's metrics and number, as TensorBoard and MLflow do."""
    from torch.utils.tensorboard import SummaryWriter

    from dagsched.registry.store import Registry

    registry = Registry(settings)
    run_name = f"train-seed{seed}-{time.strftime('%Y%m%d-%H%M%S')}"
    tb = SummaryWriter(log_dir=str(settings.home / "tensorboard" / run_name))
    params = {
        "seed": seed,
        "minutes": minutes,
        "updates": updates,
        "warm_start": warm_start,
        **settings.train.model_dump(),
    }
    with registry.run(run_name, params) as run:

        def sink(metrics: dict[str, float], step: int) -> None:
            for k, v in metrics.items():
                tb.add_scalar(k, v, step)
            run.log_metrics(metrics, step)
            if on_metrics is not None:
                on_metrics(metrics, step)
            if step % 10 == 0 and "charts/mean_reward" in metrics:
                log.info(
                    "train.update",
                    update=step,
                    **{k.split("/")[-1]: round(v, 4) for k, v in metrics.items()},
                )

        checkpoint = settings.home / "checkpoints" / f"seed{seed}.pt"
        if not resume:
            checkpoint.unlink(missing_ok=True)  # a fresh run; --resume continues this one
        with progress("PPO updates") as bar:
            result = train(
                training_scenario(settings),
                settings.train,
                updates=updates,
                minutes=minutes,
                seed=seed,
                warm_start=warm_start,
                checkpoint=checkpoint,
                sink=sink,
                on_update=lambda u, total: bar(u, total or 0),
            )
        tb.close()
        sched = GNNScheduler(result.model, result.normalizer, "candidate")
        metrics = held_out_eval(settings.sim, sched, eval_workflows)
        metrics.update(
            {
                "train/updates": result.updates,
                "train/decisions": result.decisions,
                "train/wall_s": result.wall_s,
                "train/updates_per_s": result.updates / max(result.wall_s, 1e-9),
            }
        )
        run.log_metrics(metrics, result.updates)
        with tempfile.TemporaryDirectory() as tmp:
            folder = export if export is not None else Path(tmp) / "bundle"
            save_bundle(folder, result.model, result.normalizer)
            version = registry.register_bundle(
                folder,
                run.run_id,
                metrics=metrics,
                parent=None,
                data=f"simulator curriculum, seed {seed}, {result.decisions} decisions",
            )
    log.info("train.registered", version=version, **metrics)
    return {"version": version, **metrics}
