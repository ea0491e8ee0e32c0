"""`dagsched sim ...`: run the simulator under baseline policies and compare them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import structlog
import typer

from dagsched.cli.console import print_metrics, progress_bar, stderr_is_tty
from dagsched.cli.context import help_without_command, state
from dagsched.cli.inputs import load_wfformat_path
from dagsched.cli.sim_grid import run_grid
from dagsched.reporting import to_jsonable, write_compare_report
from dagsched.sim.runner import POLICY_NAMES, simulate

log = structlog.get_logger(__name__)

sim_app = typer.Typer(
    help="Simulate the cluster under baseline policies.",
    pretty_exceptions_enable=False,
)


@sim_app.callback(invoke_without_command=True)
def sim_root(ctx: typer.Context) -> None:
    """Simulate the cluster under baseline policies."""
    help_without_command(ctx)


_POLICY_HELP = f"Policy name: {', '.join(POLICY_NAMES)}."

WORKFLOWS = typer.Option(
    None, "--workflows", min=1, help="Workflows to generate (default: from settings)."
)
LOAD = typer.Option(None, "--load", help="Offered load in (0, 2] (sim.workload.load).")
FAULT_RATE = typer.Option(
    None, "--fault-rate", help="Node crashes per node-hour (sim.faults.node_failure_per_hour)."
)


def scenario_overrides(
    workflows: int | None, load: float | None, fault_rate: float | None
) -> dict[str, Any]:
    """The settings overrides spelled by the scenario flags (dotted keys, unset flags left out)."""
    flags = {
        "sim.workload.workflows": workflows,
        "sim.workload.load": load,
        "sim.faults.node_failure_per_hour": fault_rate,
    }
    return {key: value for key, value in flags.items() if value is not None}


def check_policy(name: str, param_hint: str = "'--policy'") -> str:
    """`name` if it is a known policy, else a usage error listing the choices."""
    if name not in POLICY_NAMES:
        raise typer.BadParameter(
            f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}",
            param_hint=param_hint,
        )
    return name


def parse_policies(spec: str | None) -> list[str]:
    """`"a,b"` -> `["a", "b"]` (checked, duplicates dropped); None -> every policy."""
    if spec is None:
        return list(POLICY_NAMES)
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise typer.BadParameter("no policy named", param_hint="'--policies'")
    return [check_policy(n, "'--policies'") for n in dict.fromkeys(names)]


@sim_app.command("run")
def run_cmd(
    ctx: typer.Context,
    policy: str = typer.Option(..., "--policy", "-p", help=_POLICY_HELP),
    workflows: int | None = WORKFLOWS,
    wfformat: Path | None = typer.Option(
        None, "--wfformat", help="WfFormat JSON file, or a folder of *.json, instead of generating."
    ),
    load: float | None = LOAD,
    fault_rate: float | None = FAULT_RATE,
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed of the run."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Simulate one scenario under one policy and print its metrics."""
    if workflows is not None and wfformat is not None:
        raise typer.BadParameter("cannot be used with --workflows", param_hint="'--wfformat'")
    check_policy(policy)
    settings = state(ctx).settings(scenario_overrides(workflows, load, fault_rate))
    imported = load_wfformat_path(wfformat) if wfformat is not None else None
    log.debug("sim.run.start", policy=policy, seed=seed, imported=wfformat is not None)
    with progress_bar(f"{policy} seed {seed}", enabled=stderr_is_tty() and not as_json) as bar:
        metrics = simulate(settings.sim, policy, seed=seed, workflows=imported, progress=bar)
    log.debug("sim.run.done", policy=policy, seed=seed, wall_s=metrics.get("wall_s"))
    if as_json:
        typer.echo(json.dumps(to_jsonable(metrics), allow_nan=False))
    else:
        print_metrics(metrics, title=f"{policy}, seed {seed}")


@sim_app.command("compare")
def compare_cmd(
    ctx: typer.Context,
    policies: str | None = typer.Option(
        None, "--policies", help="Comma-separated policy names [default: all]."
    ),
    seeds: int = typer.Option(3, "--seeds", min=1, help="Run seeds 0..K-1 per policy."),
    workflows: int | None = WORKFLOWS,
    load: float | None = LOAD,
    fault_rate: float | None = FAULT_RATE,
    jobs: int = typer.Option(1, "--jobs", "-j", min=1, help="Simulations run in parallel."),
    out: Path = typer.Option(
        ..., "--out", file_okay=False, help="Folder for compare.md/.csv/.png and runs.csv."
    ),
) -> None:
    """Run every policy over several seeds and write a mean ± std comparison report."""
    names = parse_policies(policies)
    settings = state(ctx).settings(scenario_overrides(workflows, load, fault_rate))
    log.info("sim.compare.start", policies=names, seeds=seeds, jobs=jobs)
    with progress_bar("simulations", enabled=stderr_is_tty()) as bar:
        runs = run_grid(settings.sim, names, range(seeds), jobs=jobs, progress=bar)
    report = write_compare_report(out, runs)
    log.info("sim.compare.done", out=str(out), runs=len(runs))
    typer.echo(report.markdown, nl=False)
