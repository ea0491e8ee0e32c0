"""The `dagsched` console script: a Typer app whose errors are one line on stderr and exit 2."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import typer

from dagsched.cli.context import CliState, help_without_command
from dagsched.cli.demo_cmds import demo_cmd
from dagsched.cli.explain.commands import explain_cmd
from dagsched.cli.model_cmds import eval_cmd, models_app
from dagsched.cli.service_cmds import (
    broker_cmd,
    daemon_cmd,
    evaluator_cmd,
    learner_cmd,
    replay_cmd,
    updater_cmd,
)
from dagsched.cli.sim_cmds import sim_app
from dagsched.cli.topics_cmds import topics_app
from dagsched.cli.train_cmds import train_cmd
from dagsched.core.workflow import WorkflowError
from dagsched.registry.errors import RegistryError
from dagsched.settings import SettingsError

# Errors a user can cause and fix: reported as one line, exit 2, no traceback.
USER_ERRORS: tuple[type[BaseException], ...] = (
    SettingsError,
    WorkflowError,
    OSError,
    json.JSONDecodeError,
    RegistryError,
)
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


app = typer.Typer(
    name="dagsched",
    help="Online-learning scheduler for cloud workflows: simulator, training and serving.",
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback(invoke_without_command=True)
def root(
    ctx: typer.Context,
    profile: str | None = typer.Option(
        None, "--profile", help="Config overlay: demo, test or prod (env DAGSCHED_PROFILE)."
    ),
    home: Path | None = typer.Option(
        None, "--home", help="State folder, default .dagsched (env DAGSCHED_HOME)."
    ),
    log_level: str | None = typer.Option(
        None, "--log-level", help="DEBUG, INFO, WARNING or ERROR (env DAGSCHED_LOG_LEVEL)."
    ),
    config_dir: Path | None = typer.Option(
        None, "--config-dir", help="Folder of YAML profiles (env DAGSCHED_CONFIG_DIR)."
    ),
) -> None:
    """Settings come from configs/default.yaml, the profile, DAGSCHED_* variables and flags."""
    ctx.obj = CliState(profile=profile, home=home, log_level=log_level, config_dir=config_dir)
    help_without_command(ctx)


app.add_typer(sim_app, name="sim")
sim_app.command("replay")(replay_cmd)
app.command("broker")(broker_cmd)
app.command("daemon")(daemon_cmd)
app.command("updater")(updater_cmd)
app.command("learner")(learner_cmd)
app.command("evaluator")(evaluator_cmd)
app.command("train")(train_cmd)
app.add_typer(models_app, name="models")
app.add_typer(topics_app, name="topics")
app.command("eval")(eval_cmd)
app.command("explain")(explain_cmd)
app.command("demo")(demo_cmd)


def error_line(message: object) -> str:
    """`error: <message>` squeezed onto one line."""
    return "error: " + " ".join(str(message).split())


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def _usage_errors() -> tuple[type[Exception], ...]:
    # Typer >= 0.2x vendors click and roots its exceptions at TyperException; older Typer
    # raises click's own ClickException.
    base = getattr(typer, "TyperException", None)
    if base is None:
        import click

        base = click.ClickException
    return (base,)


def run(argv: Sequence[str] | None = None) -> int:
    """Run the CLI on `argv` (default: sys.argv[1:]) and return the exit code."""
    command = typer.main.get_command(app)
    try:
        rv = command.main(args=argv, prog_name="dagsched", standalone_mode=False)
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        typer.echo(error_line("interrupted"), err=True)
        return EXIT_INTERRUPTED
    except _usage_errors() as exc:
        typer.echo(error_line(exc.format_message()), err=True)  # type: ignore[attr-defined]
        return EXIT_USAGE
    except USER_ERRORS as exc:
        typer.echo(error_line(_describe(exc)), err=True)
        return EXIT_USAGE
    # non-standalone click returns the code of an explicit `Exit` (e.g. 0 after --help)
    return rv if isinstance(rv, int) else 0


def main() -> None:
    """Console-script entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
