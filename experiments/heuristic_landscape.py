"""How much do the levers a residual over heft_history can move buy, tuned by hand? Queue
priority rules beyond the shipped ones, the VPA reservation scaled, and a penalty for
placing other tasks on GPU nodes, each on held-out seeds at steady state (the evaluation's
seeds, 200 workflows a run) against heft_history_srpt, the policy's base.

    .venv/bin/python experiments/heuristic_landscape.py [--seeds 10] [--workflows 200]
        [--loads 0.5,0.8,0.95] [--out experiments/results/heuristic_landscape.json]

Variants (`VARIANTS`): a priority rule (`core.heft.PRIORITY_RULES`, plus `cp`: the least
declared critical path left in the workflow first, Decima's SJF-CP; `cp_work`: that times
the square root of the declared work left), a scale on history's recommended CPU and memory
(families with history only), and a factor on the estimated finish of non-GPU tasks on GPU
nodes. Every variant reads only what heft_history reads. Prints one table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path
from typing import Any

import numpy as np

from dagsched.core import heft
from dagsched.core.demand import (
    HEFT_RETRIES,
    WorkLeft,
    candidates,
    demand_fractions,
    finish_s,
    fits_now,
    predicted_compute_s,
    recommended_request,
)
from dagsched.core.history import predicted_use
from dagsched.core.observation import transfer_estimate_s
from dagsched.core.scheduler import Placement
from dagsched.core.ties import best_node
from dagsched.core.view import NODE_KINDS, ClusterView, TaskView
from dagsched.core.workflow import TaskType, upward_rank
from dagsched.learner.offline_eval import HELD_OUT_SEED
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import simulate
from dagsched.sim.snapshot import SchedulerPolicy

_GPU_NODE = NODE_KINDS.index("gpu")


def _cp_left(task: TaskView) -> float:
    rank = upward_rank(task.workflow)
    return max((r for r, done in zip(rank, task.done, strict=True) if not done), default=0.0)


def _cp(task: TaskView, work: WorkLeft) -> float:
    return -_cp_left(task)


def _cp_work(task: TaskView, work: WorkLeft) -> float:
    return -_cp_left(task) * work.core_s(task) ** 0.5


RULES = {**heft.PRIORITY_RULES, "cp": _cp, "cp_work": _cp_work}


@dataclass(frozen=True)
class Variant:
    """One hand-tuned heft_history."""

    priority: str = "srpt"
    cpu_scale: float = 1.0  # x history's recommended cores
    mem_scale: float = 1.0  # x history's recommended memory
    gpu_penalty: float = 0.0  # estimated finish x (1 + this) for other tasks on GPU nodes

    @property
    def name(self) -> str:
        parts = [self.priority]
        if self.cpu_scale != 1.0:
            parts.append(f"cpu x{self.cpu_scale:g}")
        if self.mem_scale != 1.0:
            parts.append(f"mem x{self.mem_scale:g}")
        if self.gpu_penalty:
            parts.append(f"gpu +{self.gpu_penalty:g}")
        return ", ".join(parts)


VARIANTS = (
    Variant("fifo"),
    Variant("srpt"),
    Variant("edf"),
    Variant("slack"),
    Variant("cp"),
    Variant("cp_work"),
    Variant("srpt", cpu_scale=0.8),
    Variant("srpt", cpu_scale=0.6),
    Variant("srpt", mem_scale=0.85),
    Variant("srpt", mem_scale=1.2),
    Variant("srpt", gpu_penalty=0.3),
    Variant("cp", gpu_penalty=0.3),
)


class HandTuned(heft.HeftHistory):
    """heft_history's placement loop (`core.heft.HeftHistory.place`) with a variant's knobs."""

    def __init__(self, v: Variant) -> None:
        super().__init__("fifo")
        self.v = v
        self._priority = RULES[v.priority]
        self.version = v.name

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        v = self.v
        view = cluster.batch_copy()
        alive = view.alive.astype(bool)
        inv_c = 1.0 / view.cores
        first_wait = view.first_wait_s()
        work = WorkLeft()
        penalty = np.where(view.kind == _GPU_NODE, 1.0 + v.gpu_penalty, 1.0)
        out: list[Placement | None] = [None] * len(tasks)
        for i in heft.heft_order(tasks):
            t = tasks[i]
            spec = t.workflow.tasks[t.idx]
            _, _, ratio = predicted_use(spec.cpu_cores, spec.mem_gb, t.history)
            rec_cores, rec_mem = recommended_request(spec.cpu_cores, spec.mem_gb, t.history)
            if t.history is not None and t.history.count:
                rec_cores, rec_mem = rec_cores * v.cpu_scale, rec_mem * v.mem_scale
            cpu_f, mem_f = demand_fractions(view, rec_cores, rec_mem)
            res_c, res_m = cpu_f * view.cores, mem_f * view.mem_gb
            speed = view.speed[:, int(spec.type)]
            compute = predicted_compute_s(
                spec.duration_s, ratio, speed, spec.cpu_cores, res_c, view.slowdown
            )
            fits = fits_now(view, res_c, res_m)
            eft = finish_s(
                view.queued_core_s * inv_c, fits, first_wait, transfer_estimate_s(view, t), compute
            )
            if spec.type != TaskType.GPU:
                eft = eft * penalty
            mask = candidates(view, alive, rec_mem)
            node = best_node(heft.base_logits(np.log1p(eft).astype(np.float32), mask))
            cpu, mem = float(np.float32(cpu_f[node])), float(np.float32(mem_f[node]))
            out[i] = Placement(node, cpu, mem, HEFT_RETRIES, 0.0, self._priority(t, work))
            view.take(t, node, cpu, mem)
        return [p for p in out if p is not None]


def _run(job: tuple[Variant, float, int, int]) -> dict[str, Any]:
    v, load, seed, workflows = job
    base = ScenarioConfig()
    sc = replace(base, workload=replace(base.workload, workflows=workflows, load=load))
    r = simulate(sc, SchedulerPolicy(HandTuned(v)), seed=seed)
    keys = ("mean_jct_s", "sla_attainment", "cost_core_s", "oom_kills")
    return {"variant": v.name, "load": load, "seed": seed, **{k: r[k] for k in keys}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--workflows", type=int, default=200)
    ap.add_argument("--loads", default="0.5,0.8,0.95")
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=Path("experiments/results/heuristic_landscape.json")
    )
    args = ap.parse_args()
    loads = [float(x) for x in args.loads.split(",")]
    seeds = [HELD_OUT_SEED + k for k in range(args.seeds)]
    jobs = [(v, lo, s, args.workflows) for v in VARIANTS for lo in loads for s in seeds]
    with Pool(args.processes) as pool:
        runs = pool.map(_run, jobs)
    rows = []
    for v in VARIANTS:
        for lo in loads:
            mine = [r for r in runs if r["variant"] == v.name and r["load"] == lo]
            rows.append(
                {"variant": v.name, "load": lo, "seeds": len(mine)}
                | {k: float(np.mean([r[k] for r in mine])) for k in
                   ("mean_jct_s", "sla_attainment", "cost_core_s", "oom_kills")}
            )  # fmt: skip
    base = {r["load"]: r for r in rows if r["variant"] == "srpt"}
    head = ("variant", "load", "JCT s", "vs srpt", "SLA", "cost", "OOM")
    print("{:24} {:>5} {:>7} {:>8} {:>6} {:>8} {:>5}".format(*head))
    for r in rows:
        b = base[r["load"]]
        print(
            f"{r['variant']:24} {r['load']:>5} {r['mean_jct_s']:>7.0f} "
            f"{r['mean_jct_s'] / b['mean_jct_s'] - 1:>+8.1%} {r['sla_attainment']:>6.3f} "
            f"{r['cost_core_s'] / b['cost_core_s'] - 1:>+8.1%} {r['oom_kills']:>5.1f}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"seeds": seeds, "workflows": args.workflows, "rows": rows, "runs": runs}
    args.out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
