"""`dagsched eval`: the trained policy against every baseline and an MCTS planner, on held-out
seeds of the default scenario, each template, three loads, heavy faults, tight deadlines and
WfFormat files.

Rows carry at least `policy, scenario, sla_attainment, mean_jct_s, p95_jct_s, cost_core_s,
decision_ms`; the report is a Markdown table, a CSV and PNG charts.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dagsched.policy.api import Scheduler, SchedulerPolicy
from dagsched.sim.config import FaultConfig, ScenarioConfig
from dagsched.sim.mcts import MCTSPolicy
from dagsched.sim.runner import POLICY_NAMES, simulate
from dagsched.sim.state import Policy
from dagsched.sim.workflow import Workflow

TIGHT_SLACK = (1.0, 1.5)
HELD_OUT_SEED = 10_000  # training draws curriculum seeds far below this
ROW_KEYS = (
    "policy",
    "scenario",
    "sla_attainment",
    "mean_jct_s",
    "p95_jct_s",
    "cost_core_s",
    "waste_core_s",
    "workflows_failed",
    "total_reward",
    "decision_ms",
    "seeds",
)


@dataclass(frozen=True)
class EvalScenario:
    """A named scenario; `workflows` replaces the generated workload when given."""

    name: str
    scenario: ScenarioConfig
    workflows: tuple[Workflow, ...] | None = None


def scenarios(
    base: ScenarioConfig, n_workflows: int, wfformat: Sequence[Workflow] = ()
) -> list[EvalScenario]:
    """default, one per template, load 0.5/0.8/0.95, faults x10, tight deadlines, and
    WfFormat (if any)."""
    wl = replace(base.workload, workflows=n_workflows)
    sc = replace(base, workload=wl)
    out = [EvalScenario("default", sc)]
    for t in base.workload.templates:
        out.append(
            EvalScenario(
                f"template:{t}",
                replace(sc, workload=replace(wl, template_share=1.0, templates=(t,))),
            )
        )
    for load in (0.5, 0.8, 0.95):
        out.append(EvalScenario(f"load:{load}", replace(sc, workload=replace(wl, load=load))))
    faults = FaultConfig(
        node_failure_per_hour=base.faults.node_failure_per_hour * 10 or 0.32,
        repair_mean_s=base.faults.repair_mean_s,
        transient_task_failure=max(0.05, base.faults.transient_task_failure),
    )
    out.append(EvalScenario("faults:x10", replace(sc, faults=faults)))
    # deadlines of 1-1.5x the critical path: where the default ones are always met, this
    # is where policies separate on SLA attainment
    out.append(EvalScenario("slack:tight", replace(sc, workload=replace(wl, slack=TIGHT_SLACK))))
    if wfformat:
        out.append(EvalScenario("wfformat", sc, tuple(wfformat)))
    return out


def make_policies(
    names: Sequence[str], model: Scheduler | None, model_name: str, mcts_budget: int
) -> dict[str, Callable[[int], Policy | str]]:
    """Factories (seed -> policy) for every requested name."""
    out: dict[str, Callable[[int], Policy | str]] = {}
    for name in names:
        if name == "mcts":
            out[name] = lambda _s: MCTSPolicy(budget=mcts_budget)
        elif name == model_name:
            if model is None:
                raise ValueError("no model to evaluate")
            m = model
            out[name] = lambda _s, m=m: SchedulerPolicy(m, model_name)  # type: ignore[misc]
        elif name in POLICY_NAMES:
            out[name] = lambda _s, n=name: n  # type: ignore[misc]
        else:
            raise ValueError(f"unknown policy {name!r}")
    return out


def evaluate(
    cases: Sequence[EvalScenario],
    policies: dict[str, Callable[[int], Policy | str]],
    seeds: int,
    *,
    mcts_workflows: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (policy, scenario): means over `seeds` held-out seeds."""
    rows = []
    total, done = len(cases) * len(policies) * seeds, 0
    for case in cases:
        for name, factory in policies.items():
            runs = []
            for k in range(seeds):
                seed = HELD_OUT_SEED + k
                sc, wfs = case.scenario, case.workflows
                if name == "mcts" and mcts_workflows is not None:  # the planner is slow
                    sc = replace(sc, workload=replace(sc.workload, workflows=mcts_workflows))
                    wfs = wfs[:mcts_workflows] if wfs is not None else None
                runs.append(simulate(sc, factory(seed), seed=seed, workflows=wfs))
                done += 1
                if progress is not None:
                    progress(done, total)
            rows.append(_row(name, case.name, runs))
    return rows


def _row(policy: str, scenario: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    mean = lambda k: float(np.mean([r[k] for r in runs]))  # noqa: E731
    decisions = sum(r["decisions"] for r in runs)
    return {
        "policy": policy,
        "scenario": scenario,
        "sla_attainment": mean("sla_attainment"),
        "mean_jct_s": mean("mean_jct_s"),
        "p95_jct_s": mean("p95_jct_s"),
        "cost_core_s": mean("cost_core_s"),
        "waste_core_s": mean("waste_core_s"),
        "workflows_failed": mean("workflows_failed"),
        "total_reward": mean("total_reward"),
        "decision_ms": 1000 * sum(r["wall_s"] for r in runs) / max(1, decisions),
        "seeds": len(runs),
    }


def write_report(
    out: Path, rows: list[dict[str, Any]], history: list[dict[str, float]] | None = None
) -> str:
    """eval.md, eval.csv, eval.json, sla.png, jct.png (+ training.png); returns the Markdown."""
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
    if history:
        _training_curves(out / "training.png", history)
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


def _training_curves(path: Path, history: list[dict[str, float]]) -> None:
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
