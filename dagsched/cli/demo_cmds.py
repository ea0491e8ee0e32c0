"""`dagsched demo`: broker, daemon and replay on this machine, then the story."""

from __future__ import annotations

import asyncio

import typer
from rich.console import Console
from rich.table import Table

from dagsched.cli.state import state

KEYS = ("sla_attainment", "mean_jct_s", "p95_jct_s", "cost_core_s", "workflows_failed")


def demo_cmd(
    ctx: typer.Context,
    workflows: int = typer.Option(30, "--workflows", min=1, help="Workflows to replay."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the replayed workload."),
) -> None:
    """Serve the champion through Kafka and Redis for a replayed workload; tell what happened."""
    from dagsched.daemon.demo import heuristic_context, run_demo

    settings = state(ctx).settings()
    result = asyncio.run(run_demo(settings, workflows, seed))
    context = heuristic_context(settings, workflows, seed)
    console = Console()
    console.print(f"\n[bold]Served by[/bold] {result['served_by']} through the embedded broker: "
                  f"{result.get('tasks_sent', '?')} tasks sent, "
                  f"{result.get('decisions_received', '?')} decisions received, "
                  f"{result.get('duplicates', 0)} duplicates, "
                  f"{result.get('dead_letters', 0)} dead letters.")
    table = Table(title="Same workload: the daemon's model vs heuristics in the simulator")
    table.add_column("policy")
    for k in KEYS:
        table.add_column(k, justify="right")
    rows = [("daemon: " + str(result["served_by"]), result), *((r["policy"], r) for r in context)]
    for name, r in rows:
        table.add_row(name, *(f"{float(r.get(k, 0)):.3f}" for k in KEYS))
    console.print(table)
