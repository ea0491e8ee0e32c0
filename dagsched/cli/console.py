"""Terminal output for commands: rich tables on stdout, progress bars on stderr (TTY only)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dagsched.reporting import format_number

ProgressFn = Callable[[int, int], None]


def stderr_is_tty() -> bool:
    """True when stderr is an interactive terminal (progress bars and colours make sense)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def _ignore(done: int, total: int) -> None:
    del done, total


@contextmanager
def progress_bar(description: str, *, enabled: bool) -> Iterator[ProgressFn]:
    """A `progress(done, total)` callback drawing a bar on stderr; a no-op when not `enabled`."""
    if not enabled:
        yield _ignore
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield update


class _FoldingTable(Table):
    """A table whose cells fold (wrap mid-word) rather than end in an ellipsis."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        """`Table.add_column`, folding by default."""
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


def fitting_table(title: str) -> Table:
    """A table for a story told at 80 columns: no outer edge or column rules (the width goes
    to the cells), headers and cells that wrap instead of being cut off with an ellipsis."""
    return _FoldingTable(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, collapse_padding=True
    )


def print_metrics(metrics: Mapping[str, Any], title: str) -> None:
    """A two-column table of `metrics` on stdout."""
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in metrics.items():
        table.add_row(key, format_number(value) if isinstance(value, float) else str(value))
    Console().print(table)
