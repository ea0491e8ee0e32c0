"""`dagsched demo`: the whole loop on this machine (the world shifts midway), then the story."""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Coroutine
from typing import Any, TypeVar

import typer
from rich.console import Console

from dagsched.cli.console import fitting_table, progress_bar, stderr_is_tty
from dagsched.cli.context import state
from dagsched.reporting import format_number

T = TypeVar("T")
SIGTERM_EXIT = 128 + signal.SIGTERM  # the shell's code for a process ended by SIGTERM

# The comparison's columns: metric key, header (words, so a narrow terminal wraps them).
KEYS: tuple[tuple[str, str], ...] = (
    ("sla_attainment", "SLA met"),
    ("mean_jct_s", "mean JCT (s)"),
    ("p95_jct_s", "p95 JCT (s)"),
    ("cost_core_s", "cost (core-s)"),
    ("workflows_failed", "failed workflows"),
)


def demo_cmd(
    ctx: typer.Context,
    workflows: int = typer.Option(200, "--workflows", min=2, help="Workflows to replay."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the replayed workload."),
    shift: bool = typer.Option(True, "--shift/--no-shift", help="Shift the world (at --shift-at)."),
    shift_at: float = typer.Option(
        0.5, "--shift-at", min=0.0, max=1.0, help="Share of the arrivals before the shift."
    ),
    wait_for_loop: bool = typer.Option(
        False,
        "--wait-for-loop",
        help="Stand simulated time still while the learner searches or the judge replays:"
        " slower, but the loop keeps up with the traffic.",
    ),
    hold_max_s: float = typer.Option(
        300.0,
        "--hold-max-s",
        min=1.0,
        help="With --wait-for-loop: the longest simulated time stands still for one search or"
        " replay; past it the demo stops waiting for the loop. Raise it for large worlds"
        " (--profile shift), where one search takes minutes.",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
) -> None:
    """Broker, daemon, learner, evaluator and a replay shifted midway; tell the story."""
    from dagsched.demo import heuristic_context, run_demo

    settings = state(ctx).settings()
    with progress_bar("replaying workflows", enabled=stderr_is_tty()) as progress:
        demo = run_demo(
            settings, workflows, seed, shift, progress, shift_at, wait_for_loop, hold_max_s
        )
        try:
            story = run_until_sigterm(demo)
        except asyncio.CancelledError:
            typer.echo("dagsched demo: stopped by SIGTERM", err=True)
            raise typer.Exit(SIGTERM_EXIT) from None
    context = heuristic_context(settings, workflows, story.shift_at_s, seed)
    doc = story.to_dict()
    if as_json:
        doc["heuristics_in_simulator"] = context
        typer.echo(json.dumps(doc, default=str))
        return
    tell(doc, context)


def run_until_sigterm(coro: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(coro)`, a SIGTERM cancelling it (`CancelledError`), so that its cleanup
    runs as after Ctrl-C: the demo's services stop, its embedded broker and replay workers
    with them, instead of the process dying with them running."""

    async def main() -> T:
        task = asyncio.ensure_future(coro)
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await task
        finally:
            loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())


def tell(doc: dict[str, Any], context: list[dict[str, Any]]) -> None:
    """The closing story: what served, what the learner made, what the evaluator decided."""
    console = Console()
    r = doc["replay"]
    console.print(
        f"\n[bold]1. Serving[/bold]: {doc['served_by']} (shipped champion) through the embedded"
        f" broker; {r.get('tasks_sent', 0)} tasks sent, {r.get('decisions_received', 0)}"
        f" decisions, {r.get('duplicates', 0)} duplicates, {r.get('rejected', 0)} re-asked,"
        f" {r.get('stale_views', 0)} batches decided on a view the events had not caught up"
        " with."
        f" Challenger share {doc['settings']['challenger_share']:.0%} of workflows."
        + (
            f" Simulated time stood still for {r['held_s']:.0f} s of wall time while the"
            " learner searched and the judge replayed."
            if r.get("held_s")
            else ""
        )
        + (
            " One search or replay outlasted --hold-max-s: from then on the loop fell behind"
            " the traffic, and the judge replayed only the newest windows."
            if r.get("hold_given_up")
            else ""
        )
    )
    if doc["shift"]:
        console.print(
            f"[bold]2. Shift[/bold] at simulated t={doc['shift_at_s']:,.0f} s, unannounced: "
            f"{shift_effects(doc['shift'])}; the observation shows none of it until outcomes do."
        )
    versions = fitting_table("3. Model versions (MLflow registry of this demo)")
    for col, atomic in (
        ("version", True),
        ("aliases", False),
        ("origin", True),
        ("parent", True),
        ("resumed from", False),
        ("transitions", True),
    ):
        versions.add_column(col, no_wrap=atomic)  # the others wrap first when it is narrow
    versions.add_column("KL to champion", justify="right")
    for v in doc["versions"]:
        versions.add_row(
            v["version"],
            "\n".join(v["aliases"]),  # one per line: a narrow column never splits one
            v["origin"],
            v["parent"],
            v["resumed_from"],
            v["transitions"],
            _short(v["kl_to_champion"]),
        )
    console.print(versions)
    how = (
        " by searching their shifts on the windows it recorded"
        if doc["settings"].get("learner") == "search"
        else " by PPO on the logs"
    )
    console.print(
        f"The learner fine-tuned the actor heads{how}, a round due every"
        f" {doc['settings']['every_n_tasks']} completed tasks: {len(doc['rounds'])} version(s)."
    )
    if searched := doc.get("searched"):
        console.print(
            f"   {len(searched)} search(es); a move is kept when it shortens the replayed"
            f" mean JCT by {doc['settings']['min_gain']:.0%}:"
        )
        for found in searched:
            moved = ", ".join(f"{k} {v:+.2f}" for k, v in found["moved"].items()) or "no move"
            windows = ", ".join(map(str, found["windows"]))
            console.print(f"   windows {windows}: {moved} ({found['gain']:+.1%} on the replays)")
    if doc["settings"].get("judge") == "replay":
        console.print(
            "[bold]4. Verdicts[/bold]: the replay judge replays each closed window for the"
            " champion and the challenger (before a challenger, the champion alone: how"
            " faithful the replay is); the challenger's live slice is a canary."
        )
        for w in doc["replay_windows"]:
            why = w["reason"]
            if w["decision"] != "unreliable":  # its reason names the fidelity already
                why += f"; fidelity error {w['jct_err']:.0%}"
            if w["jct_gain"] is not None:
                why += f", JCT {w['jct_gain']:+.1%}"
            who = (
                f"{w['champion']} alone"
                if w["challenger"] is None
                else f"{w['champion']} with {w['challenger']} on its slice"
                if w["decision"] == "measured"
                else f"{w['challenger']} vs {w['champion']}"
            )
            console.print(f"   window {w['window']}: {who}: {w['decision']} ({why})")
        if not doc["replay_windows"] and not doc["verdicts"]:
            console.print("   none: no window closed while a challenger was under test.")
    else:
        console.print(f"[bold]4. Verdicts[/bold] ({doc['settings']['rule']}):")
        if not doc["verdicts"]:
            console.print(
                "   none: no challenger gathered enough evidence to be promoted or retired"
                f" (at least {doc['settings']['min_samples']} workflows per arm)."
            )
    for v in doc["verdicts"]:
        console.print(f"   {v['action']} v{v['version']}: {v.get('reason', '')}")
    for a in doc["audit"]:
        console.print(f"   audit: {a['action']} v{a['version']} by {a['actor']}: {a['reason']}")
    sla = fitting_table("5. SLA attainment, workflows by arrival")
    for col in ("period", "all arms", "champion arm", "challenger arm"):
        sla.add_column(col, justify="right")
    for period in ("before_shift", "after_shift", "all"):
        cells = doc["sla"][period]
        sla.add_row(
            period.replace("_", " "),
            *(
                f"{cells[a]['sla_attainment']:.3f} ({cells[a]['workflows']})"
                for a in ("all", "champion", "challenger")
            ),
        )
    console.print(sla)
    table = fitting_table(
        "6. Same workload and shift: the served run, and the frozen champion and heft_history"
        " in the simulator"
    )
    table.add_column("policy")
    for _, header in KEYS:
        table.add_column(header, justify="right")
    for name, row in [("served loop", doc["replay"]), *((c["policy"], c) for c in context)]:
        table.add_row(name, *(_metric(k, row.get(k, 0)) for k, _ in KEYS))
    console.print(table)
    console.print(
        "The simulator rows share one set of random draws (task runtimes, failures, crashes);"
        " the served run has its own, so its gap to them is not what the loop gained: the"
        " replay verdicts above are."
    )
    console.print(
        "Browse the versions and the audit trail: .venv/bin/mlflow ui --backend-store-uri"
        f" sqlite:///{doc['settings']['home']}/mlflow.db"
    )


def _duration(seconds: float) -> str:
    """`3600` -> `1 h`, `600` -> `10 min`, `45` -> `45 s`."""
    for unit, size in (("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def shift_effects(shift: dict[str, Any]) -> str:
    """The shift's effects in words, those left at their neutral value unsaid."""
    said = []
    if shift.get("oom_restart_s", 0) > 0:
        said.append(
            f"the retry after an OOM kill first restarts for {_duration(shift['oom_restart_s'])}"
        )
    if shift.get("mem_spread", 1) != 1:
        said.append(
            f"memory peaks spread {shift['mem_spread']:.3g} times as wide around their"
            " family's median"
        )
    if shift.get("neighbour_slowdown", 0) > 0:
        said.append(
            f"a task on a busy node runs up to {1 + shift['neighbour_slowdown']:.3g} times"
            " slower (noisy neighbours)"
        )
    return "; ".join(said) if said else "no effect switched on"


def _short(tag: str) -> str:
    """A registry metric tag (6 significant digits) at 3, so the column stays narrow."""
    try:
        return f"{float(tag):.3g}"
    except ValueError:
        return tag


def _metric(key: str, value: Any) -> str:
    if key == "workflows_failed":
        return f"{int(value or 0)}"
    return format_number(float(value or 0))
