"""Aggregate per-run metrics into per-policy mean ± std and write them as Markdown, CSV and PNG.

Used by `dagsched sim compare` and meant for any later command that compares policies over
seeds (e.g. evaluation of trained models): it only needs a list of metric dicts with a
`policy` key.
"""

from __future__ import annotations

import csv
import math
import numbers
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Columns of the comparison table, in order.
METRICS: tuple[str, ...] = (
    "sla_attainment",
    "mean_jct_s",
    "p95_jct_s",
    "mean_wait_s",
    "cost_core_s",
    "waste_core_s",
    "fairness",
    "migrations",
    "task_failures",
    "workflows_failed",
    "total_reward",
)

# (metric, panel title) of the comparison figure.
PLOTTED: tuple[tuple[str, str], ...] = (
    ("sla_attainment", "SLA attainment"),
    ("mean_jct_s", "mean JCT (s)"),
    ("cost_core_s", "cost (core-s)"),
)


@dataclass(frozen=True)
class Stat:
    """Mean and sample standard deviation of one metric over `n` finite values."""

    mean: float
    std: float
    n: int


@dataclass(frozen=True)
class PolicySummary:
    """One policy's statistics over its runs."""

    policy: str
    runs: int
    stats: dict[str, Stat]


@dataclass(frozen=True)
class CompareReport:
    """What `write_compare_report` wrote, and the Markdown table it wrote."""

    markdown: str
    summaries: list[PolicySummary]
    files: dict[str, Path]


def mean_std(values: Iterable[Any]) -> Stat:
    """Mean and sample std (ddof=1; 0 for one value) of the finite numbers in `values`."""
    xs = [float(v) for v in values if _is_number(v) and math.isfinite(float(v))]
    if not xs:
        return Stat(math.nan, math.nan, 0)
    std = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return Stat(statistics.fmean(xs), std, len(xs))


def summarize(
    runs: Sequence[Mapping[str, Any]], metrics: Sequence[str] = METRICS
) -> list[PolicySummary]:
    """Group `runs` by their `policy` (first-seen order) and take mean ± std of each metric."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for run in runs:
        groups.setdefault(str(run["policy"]), []).append(run)
    return [
        PolicySummary(policy, len(rows), {m: mean_std(r.get(m) for r in rows) for m in metrics})
        for policy, rows in groups.items()
    ]


def _decimals(x: float) -> int:
    return 1 if abs(x) >= 100 else 3


def format_number(x: float) -> str:
    """Compact, fixed-point formatting for tables: 3 decimals below 100, 1 above."""
    if not math.isfinite(x):
        return "n/a"
    return f"{x:.{_decimals(x)}f}"


def format_stat(stat: Stat) -> str:
    """`mean ± std` with the precision of the mean, or `n/a` when there were no finite values."""
    if stat.n == 0:
        return "n/a"
    d = _decimals(stat.mean)
    return f"{stat.mean:.{d}f} ± {stat.std:.{d}f}"


def markdown_table(summaries: Sequence[PolicySummary], metrics: Sequence[str] = METRICS) -> str:
    """A GitHub-flavoured Markdown table: one row per policy, one `mean ± std` column per metric."""
    header = ["policy", *metrics]
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * len(metrics)) + "|",
    ]
    for s in summaries:
        cells = [s.policy, *(format_stat(s.stats[m]) for m in metrics)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_runs_csv(path: Path, runs: Sequence[Mapping[str, Any]]) -> None:
    """Every run as a row; columns are the union of the runs' keys, policy and seed first."""
    columns: dict[str, None] = {"policy": None, "seed": None}
    for run in runs:
        columns.update(dict.fromkeys(run))
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns), restval="")
        writer.writeheader()
        for run in runs:
            writer.writerow({k: _csv_value(v) for k, v in run.items()})


def write_summary_csv(
    path: Path, summaries: Sequence[PolicySummary], metrics: Sequence[str] = METRICS
) -> None:
    """One row per policy: `policy, runs`, then `<metric>_mean, <metric>_std` per metric."""
    fields = ["policy", "runs"] + [f"{m}_{part}" for m in metrics for part in ("mean", "std")]
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(fields)
        for s in summaries:
            row: list[object] = [s.policy, s.runs]
            for m in metrics:
                row += [_csv_value(s.stats[m].mean), _csv_value(s.stats[m].std)]
            writer.writerow(row)


def write_plot(path: Path, summaries: Sequence[PolicySummary]) -> None:
    """Bar charts with std error bars of SLA attainment, mean JCT and cost, one bar per policy."""
    # The object API with an explicit Agg canvas: no pyplot global state, no display needed.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names = [s.policy for s in summaries]
    fig = Figure(figsize=(4.2 * len(PLOTTED), 4.0), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(PLOTTED))
    for ax, (metric, title) in zip(axes, PLOTTED, strict=True):
        means = [_nan_to_zero(s.stats[metric].mean) for s in summaries]
        stds = [_nan_to_zero(s.stats[metric].std) for s in summaries]
        ax.bar(names, means, yerr=stds, capsize=4, color="tab:blue", alpha=0.8)
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=45)
        ax.grid(axis="y", alpha=0.3)
    runs = max((s.runs for s in summaries), default=0)
    fig.suptitle(f"policies compared over {runs} run(s) each (mean ± std)")
    fig.savefig(path, dpi=120)


def write_compare_report(out_dir: Path, runs: Sequence[Mapping[str, Any]]) -> CompareReport:
    """Write compare.md, compare.csv, runs.csv and compare.png into `out_dir` (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    summaries = summarize(runs)
    markdown = markdown_table(summaries)
    files = {
        "markdown": out_dir / "compare.md",
        "summary_csv": out_dir / "compare.csv",
        "runs_csv": out_dir / "runs.csv",
        "plot": out_dir / "compare.png",
    }
    files["markdown"].write_text(markdown, encoding="utf-8")
    write_summary_csv(files["summary_csv"], summaries)
    write_runs_csv(files["runs_csv"], runs)
    write_plot(files["plot"], summaries)
    return CompareReport(markdown, summaries, files)


def to_jsonable(obj: Any) -> Any:
    """Plain JSON types: numpy scalars unwrapped, tuples as lists, NaN and infinities as null."""
    if isinstance(obj, Mapping):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy scalars and arrays
        obj = obj.tolist()
    if isinstance(obj, list | tuple):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    return str(obj)


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real)  # includes bool and numpy scalars


def _nan_to_zero(x: float) -> float:
    return x if math.isfinite(x) else 0.0


def _csv_value(v: Any) -> Any:
    v = to_jsonable(v)
    return "" if v is None else v
