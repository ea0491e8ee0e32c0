"""`dagsched explain --task-id`'s terminal output: what one explanation says, as rich tables."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from rich.table import Table

from dagsched.policy.explanation import BASELINE, METHOD, TARGETS, Explanation


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000 or abs(x) < 1e-3:
        return f"{x:.3g}"
    return f"{x:.4f}".rstrip("0").rstrip(".")


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + _fmt(x)


def print_table(ex: Explanation, top: int, png: Path | None) -> None:
    """The one-decision report on stdout: the choice, its runner-up, and tables of the top
    contributions to the chosen logit, the logit gap and the continuous values."""
    con = _console()
    m = ex.meta
    probs = ex.probabilities
    c, r = ex.chosen, ex.runner_up
    vals = ex.values
    con.print(
        f"[bold]{m['task_id']} attempt {m['attempt']}[/]: model {m['model_version']} "
        f"({m['arm']}) placed it on [bold]{ex.node_name(c)}[/] (index {c}, p={probs[c]:.2f}), "
        f"cpu {vals[0]:.2f}, mem {vals[1]:.2f}, retries {vals[2]:.2f} (Beta means)"
    )
    if r is not None:
        con.print(
            f"runner-up: {ex.node_name(r)} (index {r}, p={probs[r]:.2f}); "
            f"logit gap {ex.logits[c] - ex.logits[r]:.4f}"
        )
    rep = m.get("reproduces_log", {})
    if not rep.get("node", True) or not rep.get("values", True):
        con.print(
            f"[yellow]warning[/]: this model now picks {ex.node_name(ex.recomputed_choice)} "
            "or other values than the log says: its files are not the ones that decided"
        )
    con.print(f"method: {METHOD}, {ex.n_steps} steps; baseline: {BASELINE}")

    table = Table(title=f"Top contributions to the {TARGETS['logit_chosen'][0]}")
    for col, just in (
        ("feature", "left"),
        ("belongs to", "left"),
        ("value", "right"),
        ("contribution", "right"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for x in ex.top("logit_chosen", top):
        table.add_row(x.feature, x.entity, _fmt(x.value), _signed(x.contribution))
    con.print(table)

    if r is not None:
        sep = Table(
            title=f"What separated {ex.node_name(c)} from {ex.node_name(r)} "
            f"(contributions to the logit gap)"
        )
        for col in ("feature", ex.node_name(c), ex.node_name(r), "contribution"):
            sep.add_column(col, justify="left" if col == "feature" else "right")
        for row in ex.separation(top):
            sep.add_row(
                row["feature"],
                _fmt(row["chosen_value"]),
                _fmt(row["runner_up_value"]),
                _signed(row["contribution"]),
            )
        sep.add_row("(cluster + DAG features, shared)", "", "", _signed(ex.shared_gap()))
        con.print(sep)

    cont = Table(title="Continuous values at the chosen node: top contributions")
    for col in ("value", "decided", "baseline", "top features (contribution)"):
        cont.add_column(
            col, justify="left" if col in ("value", "top features (contribution)") else "right"
        )
    for name in ("cpu", "mem", "max_retries"):
        t = ex.targets[name]
        tops = ", ".join(
            f"{x.feature} @ {x.entity} {_signed(x.contribution)}" for x in ex.top(name, 3)
        )
        cont.add_row(name, _fmt(t.output), _fmt(t.baseline_output), tops)
    con.print(cont)
    status = "ok" if ex.complete else "[red]FAILED[/]"
    con.print(
        "completeness: contributions sum to f(x) - f(baseline) for every target within "
        f"max(0.01, 1% of the change): {status} (largest error {ex.max_error:.2g})"
    )
    if png is not None:
        con.print(f"wrote {png}")
