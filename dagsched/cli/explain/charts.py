"""Charts of `dagsched explain`: the per-decision heatmap and the per-version feature bars.

Drawing only (matplotlib's object API on an Agg canvas, no pyplot state); the attributions
come from `dagsched.policy.attribution`, the types from `dagsched.policy.explanation`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dagsched.core.observation import CLUSTER_FEATURES, DAG_FEATURES, NODE_FEATURES
from dagsched.policy.explanation import Explanation


def write_heatmap(path: Any, ex: Explanation, title: str = "") -> None:
    """PNG: per-node contributions of each node feature to that node's own logit (nodes x
    features), chosen and runner-up marked; beside it the top cluster / DAG contributions to
    the chosen node's logit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import TwoSlopeNorm
    from matplotlib.figure import Figure

    grid = (
        ex.targets["node_scores"].nodes
        if "node_scores" in ex.targets
        else ex.targets["logit_chosen"].nodes
    )
    n = grid.shape[0]
    fig = Figure(figsize=(15, max(4.5, 0.24 * n + 2.2)))
    FigureCanvasAgg(fig)
    ax, side = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    lim = float(np.abs(grid).max()) or 1.0
    img = ax.imshow(grid, aspect="auto", cmap="RdBu_r", norm=TwoSlopeNorm(0.0, -lim, lim))
    ax.set_xticks(range(len(NODE_FEATURES)), NODE_FEATURES, rotation=60, ha="right", fontsize=8)
    labels = []
    for i in range(n):
        mark = " ◀ chosen" if i == ex.chosen else " ◁ runner-up" if i == ex.runner_up else ""
        dead = "" if ex.obs.mask[i] else " (down)"
        labels.append(f"{ex.node_name(i)}{dead}{mark}")
    ax.set_yticks(range(n), labels, fontsize=7)
    for row in (ex.chosen, ex.runner_up):
        if row is not None:
            ax.axhline(row - 0.5, color="k", lw=0.8)
            ax.axhline(row + 0.5, color="k", lw=0.8)
    ax.set_title("contribution of each node's features to its own logit", fontsize=10)
    fig.colorbar(img, ax=ax, fraction=0.03, pad=0.01, label="IG contribution (logit)")

    t = ex.targets["logit_chosen"]
    shared = [(f"cluster.{nm}", float(t.cluster[f])) for f, nm in enumerate(CLUSTER_FEATURES)]
    for f, nm in enumerate(DAG_FEATURES):
        shared.append((f"dag.{nm}", float(t.dag[:, f].sum())))
    shared.sort(key=lambda x: -abs(x[1]))
    shared = shared[:12][::-1]
    side.barh(
        [s[0] for s in shared],
        [s[1] for s in shared],
        color=["#c0392b" if s[1] > 0 else "#2c6fbb" for s in shared],
    )
    side.axvline(0, color="k", lw=0.6)
    side.tick_params(axis="y", labelsize=8)
    side.set_title("cluster / DAG features → chosen logit", fontsize=10)
    if title:
        fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_bars(
    path: Any,
    title: str,
    series: dict[str, dict[str, float]],
    top: int = 15,
    xlabel: str = "mean |IG attribution| per decision",
) -> None:
    """PNG: horizontal bars of the `top` features (by the first series) for each series."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    first = next(iter(series.values()))
    names = sorted(first, key=lambda x: -first[x])[:top][::-1]
    fig = Figure(figsize=(9, 0.32 * len(names) + 1.8))
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    h = 0.8 / len(series)
    y = np.arange(len(names))
    for s, (label, vals) in enumerate(series.items()):
        ax.barh(
            y + (s - (len(series) - 1) / 2) * h, [vals.get(x, 0.0) for x in names], h, label=label
        )
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
