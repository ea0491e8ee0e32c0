"""`dagsched train`: PPO on the simulator, then a registered (and optionally exported) version."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import typer

from dagsched.cli.console import print_metrics, progress_bar, stderr_is_tty
from dagsched.cli.context import state


def train_cmd(
    ctx: typer.Context,
    minutes: float | None = typer.Option(None, "--minutes", min=0.05, help="Wall-clock budget."),
    updates: int | None = typer.Option(
        None,
        "--updates",
        min=0,
        help="PPO updates to run (0: the heft_history base itself, with its fitted normalizer).",
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of everything random."),
    warm_start: str = typer.Option(
        "none", "--warm-start", help="Heuristic to imitate before PPO, or 'none'."
    ),
    export: Path | None = typer.Option(
        None, "--export", help="Also write the model bundle to this folder (e.g. models/champion)."
    ),
    resume: bool = typer.Option(False, "--resume", help="Continue from the last checkpoint."),
    eval_workflows: int = typer.Option(
        60, "--eval-workflows", min=1, help="Workflows per held-out evaluation seed."
    ),
) -> None:
    """Train the GNN actor-critic with PPO; register the result as a new MLflow version."""
    if (minutes is None) == (updates is None):
        raise typer.BadParameter("give exactly one of --minutes or --updates")
    from dagsched.learner.pipeline import run_training  # torch: import only when training

    settings = state(ctx).settings()
    teacher = None if warm_start == "none" else warm_start
    history: list[dict[str, float]] = []
    result = run_training(
        settings,
        minutes=minutes,
        updates=updates,
        seed=seed,
        warm_start=teacher,
        export=export,
        resume=resume,
        eval_workflows=eval_workflows,
        progress=partial(progress_bar, enabled=stderr_is_tty()),
        on_metrics=lambda m, step: history.append({**m, "step": step}),
    )
    if history:
        from dagsched.cli.eval_report import training_chart

        chart = (
            export / "training.png"
            if export is not None
            else settings.home / "runs" / f"training-v{result['version']}.png"
        )
        chart.parent.mkdir(parents=True, exist_ok=True)
        training_chart(chart, history)
        result["training_chart"] = str(chart)
    print_metrics(result, title="training result")
