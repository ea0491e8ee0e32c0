"""`dagsched eval`: the trained policy against every baseline and an MCTS planner, on held-out
seeds of the default scenario, each template, three loads, heavy faults, tight deadlines and
WfFormat files.

Rows carry at least `policy, scenario, sla_attainment, mean_jct_s, p95_jct_s, cost_core_s,
decision_ms` (`ROW_KEYS`); `dagsched.cli.eval_report` writes them as Markdown, CSV and charts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from dagsched.core.scheduler import Scheduler
from dagsched.core.workflow import Workflow
from dagsched.sim.config import FaultConfig, ScenarioConfig
from dagsched.sim.mcts import MCTSPolicy
from dagsched.sim.runner import POLICY_NAMES, simulate
from dagsched.sim.runs import Policy
from dagsched.sim.snapshot import SchedulerPolicy

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
    "oom_kills",
    "reserved_util",
    "used_util",
    "total_reward",
    "decision_ms",
    "seeds",
)
DEFAULT_LOADS = (0.5, 0.8, 0.95)


@dataclass(frozen=True)
class EvalScenario:
    """A named scenario; `workflows` replaces the generated workload when given."""

    name: str
    scenario: ScenarioConfig
    workflows: tuple[Workflow, ...] | None = None


def scenarios(
    base: ScenarioConfig,
    n_workflows: int,
    wfformat: Sequence[Workflow] = (),
    loads: Sequence[float] = DEFAULT_LOADS,
) -> list[EvalScenario]:
    """default, one per template, one per load (`load:0.5` ...), faults x10, tight deadlines,
    and WfFormat (if any)."""
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
    for load in loads:
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
        "oom_kills": mean("oom_kills"),
        "reserved_util": mean("reserved_util"),
        "used_util": mean("used_util"),
        "total_reward": mean("total_reward"),
        "decision_ms": 1000 * sum(r["wall_s"] for r in runs) / max(1, decisions),
        "seeds": len(runs),
    }
