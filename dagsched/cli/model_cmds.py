"""`dagsched models ...` and `dagsched eval`: inspect registry versions, evaluate a model."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dagsched.cli.console import progress_bar, stderr_is_tty
from dagsched.cli.context import help_without_command, state

models_app = typer.Typer(
    help="Inspect policy versions in the MLflow registry.", no_args_is_help=False
)


@models_app.callback(invoke_without_command=True)
def _models(ctx: typer.Context) -> None:
    help_without_command(ctx)


def _registry(ctx: typer.Context) -> Any:
    from dagsched.registry.store import Registry

    reg = Registry(state(ctx).settings())
    reg.ensure_champion()
    return reg


@models_app.command("list")
def list_cmd(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout."),
) -> None:
    """Versions with their aliases, metrics, tags and audit trail (the shipped champion if
    empty)."""
    from dagsched.registry.promotion import audit_trail

    reg = _registry(ctx)
    trail = audit_trail(reg)
    by_version: dict[str, list[str]] = {}
    for alias, v in reg.aliases().items():
        by_version.setdefault(v, []).append(alias)
    rows = []
    for mv in reg.versions():
        tags = dict(mv.tags)
        rows.append(
            {
                "version": str(mv.version),
                "aliases": sorted(by_version.get(str(mv.version), [])),
                "created": mv.creation_timestamp,
                "run_id": mv.run_id,
                "parent": tags.get("parent", ""),
                "data": tags.get("data", ""),
                "metrics": {k[7:]: v for k, v in tags.items() if k.startswith("metric.")},
                "tags": {
                    k: v
                    for k, v in tags.items()
                    if not k.startswith(("metric.", "sha256.", "audit."))
                    and k not in ("parent", "data")
                },
                "audit": [r for r in trail if str(mv.version) in (r["version"], r["from_version"])],
            }
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title=f"registered model {reg.name}")
    for col in ("version", "aliases", "parent", "data", "metrics"):
        table.add_column(col)
    for r in rows:
        metrics = ", ".join(
            f"{k}={v}" for k, v in sorted(r["metrics"].items()) if k.startswith("eval/")
        )
        table.add_row(r["version"], ",".join(r["aliases"]), r["parent"], r["data"], metrics)
    Console().print(table)
    if trail:
        audit = Table(title="audit trail (oldest first)")
        for col in ("when", "action", "version", "from", "actor", "reason"):
            audit.add_column(col)
        for a in trail:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["at"]))
            audit.add_row(
                when, a["action"], a["version"], a["from_version"], a["actor"], a["reason"]
            )
        Console().print(audit)


@models_app.command("show")
def show_cmd(
    ctx: typer.Context, version: str = typer.Argument(..., help="Version number.")
) -> None:
    """Every tag of one version (checksums, lineage, metrics) as JSON."""
    reg = _registry(ctx)
    from mlflow.exceptions import MlflowException

    try:
        mv = reg.client.get_model_version(reg.name, version)
    except MlflowException:
        raise typer.BadParameter(f"no version {version} of {reg.name}") from None
    from dagsched.registry.promotion import audit_trail

    aliases = [a for a, v in reg.aliases().items() if v == str(mv.version)]
    typer.echo(
        json.dumps(
            {
                "version": str(mv.version),
                "aliases": aliases,
                "run_id": mv.run_id,
                "source": mv.source,
                "tags": dict(mv.tags),
                "audit": audit_trail(reg, str(mv.version)),
            },
            indent=2,
        )
    )


def _actor() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"operator:{user}@{socket.gethostname()}"


@models_app.command("promote")
def promote_cmd(
    ctx: typer.Context,
    version: str = typer.Argument(..., help="Version number to make the champion."),
    reason: str = typer.Option(..., "--reason", help="Why (stored in the audit trail)."),
) -> None:
    """Verify VERSION (checksums + smoke inference), then make it the champion; the old
    champion keeps the alias `previous`; daemons are notified on Redis."""
    from dagsched.registry.promotion import Promoter

    record = Promoter(_registry(ctx)).promote(version, reason, _actor())
    typer.echo(json.dumps(record))


@models_app.command("rollback")
def rollback_cmd(
    ctx: typer.Context,
    reason: str = typer.Option(..., "--reason", help="Why (stored in the audit trail)."),
) -> None:
    """Give the champion alias back to the `previous` version (verified first)."""
    from dagsched.registry.promotion import Promoter

    record = Promoter(_registry(ctx)).rollback(reason, _actor())
    typer.echo(json.dumps(record))


def _loads(text: str) -> list[float]:
    """`--loads`: comma-separated numbers in (0, 2]."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--loads: not a list of numbers: {text!r}") from None
    if not out or not all(0 < x <= 2 for x in out):
        raise typer.BadParameter(f"--loads: each load must be in (0, 2], got {text!r}")
    return out


def eval_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(
        None, "--model", help="Version, models:/NAME@alias, or bundle folder [default: champion]."
    ),
    policies: str | None = typer.Option(
        None, "--policies", help="Comma-separated [default: model, baselines, mcts]."
    ),
    wfformat: Path | None = typer.Option(None, "--wfformat", help="WfFormat file or folder."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Held-out seeds per scenario."),
    workflows: int = typer.Option(40, "--workflows", min=1, help="Workflows per run."),
    mcts_budget: int = typer.Option(8, "--mcts-budget", min=1, help="Rollouts per decision."),
    mcts_workflows: int = typer.Option(
        8, "--mcts-workflows", min=1, help="Workflows per MCTS run (it is slow)."
    ),
    scenarios_only: str | None = typer.Option(
        None, "--scenarios", help="Comma-separated scenario names to keep."
    ),
    loads: str = typer.Option(
        "0.5,0.8,0.95", "--loads", help="Comma-separated loads, one `load:L` scenario each."
    ),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Report folder."),
    as_json: bool = typer.Option(False, "--json", help="One JSON array of rows on stdout."),
) -> None:
    """Evaluate a model against every baseline and MCTS; write Markdown, CSV and PNG charts."""
    from dagsched.cli.eval_report import write_report
    from dagsched.cli.inputs import load_wfformat_path
    from dagsched.learner.offline_eval import evaluate, make_policies, scenarios
    from dagsched.registry.store import Registry
    from dagsched.registry.uri import load_model
    from dagsched.sim.runner import POLICY_NAMES

    load_list = _loads(loads)  # bad flags fail before anything is opened
    settings = state(ctx).settings()
    name, sched = load_model(Registry(settings), model)
    names = (
        [p.strip() for p in policies.split(",") if p.strip()]
        if policies
        else [name, *POLICY_NAMES, "mcts"]
    )
    names = [name if p in ("champion", "model") else p for p in names]
    imported = load_wfformat_path(wfformat) if wfformat is not None else []
    cases = scenarios(settings.sim, workflows, imported, load_list)
    if scenarios_only:
        keep = {s.strip() for s in scenarios_only.split(",")}
        cases = [c for c in cases if c.name in keep]
        if not cases:
            raise typer.BadParameter(f"no scenario named {sorted(keep)}")
    try:
        factories = make_policies(names, sched, name, mcts_budget)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with progress_bar("evaluations", enabled=stderr_is_tty() and not as_json) as bar:
        rows = evaluate(cases, factories, seeds, mcts_workflows=mcts_workflows, progress=bar)
    md = write_report(out, rows)
    typer.echo(json.dumps(rows) if as_json else md, nl=not as_json or True)
