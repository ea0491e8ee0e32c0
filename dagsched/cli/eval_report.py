"""The `dagsched eval` report: the rows of `dagsched.learner.offline_eval` as Markdown, CSV, JSON
and PNG charts (grouped bars per scenario, mean JCT against load per policy); and the training
curves `dagsched train` draws."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np

from dagsched.learner.offline_eval import ROW_KEYS


def write_report(out: Path, rows: list[dict[str, Any]]) -> str:
    """eval.md, eval.csv, eval.json, sla.png, jct.png, jct_vs_load.png (when rows have two or
    more `load:L` scenarios); returns the Markdown."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "eval.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROW_KEYS))
        w.writeheader()
        w.writerows(rows)
    (out / "eval.json").write_text(json.dumps(rows, indent=2) + "\n")
    md = ["| " + " | ".join(ROW_KEYS) + " |", "|" + "---|" * len(ROW_KEYS)]
    for r in rows:
        md.append("| " + " | ".join(_fmt(r[k]) for k in ROW_KEYS) + " |")
    text = "\n".join(md) + "\n"
    (out / "eval.md").write_text(text)
    for metric, fname, label in (
        ("sla_attainment", "sla.png", "SLA attainment"),
        ("mean_jct_s", "jct.png", "mean completion time (s)"),
    ):
        _grouped_bars(out / fname, rows, metric, label)
    if len({r["scenario"] for r in rows if r["scenario"].startswith("load:")}) >= 2:
        _jct_vs_load(out / "jct_vs_load.png", rows)
    return text


def _fmt(v: Any) -> str:
    return f"{v:.3f}" if isinstance(v, float) else str(v)


def _grouped_bars(path: Path, rows: list[dict[str, Any]], metric: str, label: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    scen = list(dict.fromkeys(r["scenario"] for r in rows))
    pols = list(dict.fromkeys(r["policy"] for r in rows))
    val = {(r["policy"], r["scenario"]): r[metric] for r in rows}
    fig = Figure(figsize=(max(8, 1.1 * len(scen)), 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(pols)
    x = np.arange(len(scen))
    for i, p in enumerate(pols):
        ax.bar(x + i * width, [val.get((p, s), np.nan) for s in scen], width, label=p)
    ax.set_xticks(x + 0.4 - width / 2, scen, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel(label)
    ax.set_title(f"{label} by policy and scenario")
    ax.legend(fontsize=7, ncol=min(5, len(pols)))
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _jct_vs_load(path: Path, rows: list[dict[str, Any]]) -> None:
    """Mean JCT against load, one line per policy, from the `load:L` scenarios."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_policy: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r["scenario"].startswith("load:"):
            load = float(r["scenario"].split(":", 1)[1])
            by_policy.setdefault(r["policy"], []).append((load, r["mean_jct_s"]))
    fig = Figure(figsize=(7, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for policy, pts in by_policy.items():
        pts.sort()
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
    ax.set_xlabel("load (share of the cluster heft_history keeps reserved)")
    ax.set_ylabel("mean completion time (s)")
    ax.set_title("mean JCT against load")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def training_chart(path: Path, history: list[dict[str, float]]) -> None:
    """Reward, episode SLA, approximate KL and entropy against the PPO update (`history`: the
    metrics of each update, with its `step`)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    keys = [
        k
        for k in ("charts/mean_reward", "charts/episode_sla", "losses/approx_kl", "losses/entropy")
        if any(k in h for h in history)
    ]
    fig = Figure(figsize=(4 * max(1, len(keys)), 3.2))
    FigureCanvasAgg(fig)
    for i, k in enumerate(keys):
        ax = fig.add_subplot(1, len(keys), i + 1)
        pts = [(h["step"], h[k]) for h in history if k in h]
        ax.plot([p[0] for p in pts], [p[1] for p in pts])
        ax.set_title(k, fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
