"""Synthetic workload: random workflows (templates or layered DAGs) and Poisson arrivals.

Every draw comes from the `np.random.Generator` handed in, so one seed gives one workload.
Arrivals are timed so that the offered load (node-seconds occupied per second over the
cluster's nodes, see `offered_node_s`) matches `WorkloadConfig.load`: the share of the
cluster that a good type-aware scheduler keeps reserved.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from dagsched.core.workflow import TASK_TYPE_NAMES, TaskSpec, TaskType, Workflow
from dagsched.sim.config import ClusterConfig, TruthConfig, WorkloadConfig
from dagsched.sim.dags import drop_edges, layered_dag
from dagsched.sim.templates import TEMPLATES
from dagsched.sim.truth import expected_ratios

MB = 1e6
GB = 1e9

# Per task type: (cores low, cores high), (memory GB low, memory GB high), median output bytes.
DEMANDS: dict[TaskType, tuple[tuple[float, float], tuple[float, float], float]] = {
    TaskType.CPU: ((1.0, 8.0), (2.0, 16.0), 200 * MB),
    TaskType.IO: ((1.0, 4.0), (2.0, 16.0), 2 * GB),
    TaskType.GPU: ((2.0, 8.0), (8.0, 64.0), 200 * MB),
    TaskType.MEM: ((1.0, 4.0), (32.0, 160.0), 200 * MB),
}
_STAGE_NUMBER = re.compile(r"-\d+$")  # "map-12" is the 13th task of stage "map"
OUTPUT_SIGMA = 1.0  # log-space spread of output sizes
NOISE_FLOOR = 0.25  # a perturbed demand never drops below this share of its drawn value


def sample_durations(
    rng: np.random.Generator, n: int, base_s: float, long_share: float
) -> np.ndarray:
    """`n` durations: U(t, 3t) for short tasks, U(10t, 15t) for a `long_share` of long ones."""
    long = rng.random(n) < long_share
    short = rng.uniform(base_s, 3 * base_s, n)
    longd = rng.uniform(10 * base_s, 15 * base_s, n)
    return np.where(long, longd, short)


def perturb_demand(rng: np.random.Generator, base: np.ndarray, sigma: float) -> np.ndarray:
    """`base` x N(1, sigma), each factor clipped to >= `NOISE_FLOOR`."""
    factor = rng.normal(1.0, sigma, base.shape) if sigma > 0 else np.ones(base.shape)
    return base * np.maximum(factor, NOISE_FLOOR)


def sample_output_bytes(rng: np.random.Generator, types: Sequence[TaskType]) -> np.ndarray:
    """Lognormal output sizes (sigma `OUTPUT_SIGMA`) around each type's median."""
    medians = np.array([DEMANDS[t][2] for t in types])
    return medians * np.exp(rng.normal(0.0, OUTPUT_SIGMA, len(types)))


def sample_tasks(
    rng: np.random.Generator,
    cfg: WorkloadConfig,
    types: Sequence[TaskType],
    names: Sequence[str],
    edges: Sequence[tuple[int, int]],
    families: Sequence[str] | None = None,
) -> list[TaskSpec]:
    """Draw duration, demands, data sizes and cold start for each task of a DAG shape."""
    n = len(types)
    dur = sample_durations(rng, n, cfg.base_duration_s, cfg.long_task_share)
    lows = np.array([[DEMANDS[t][0][0], DEMANDS[t][1][0]] for t in types])
    highs = np.array([[DEMANDS[t][0][1], DEMANDS[t][1][1]] for t in types])
    demand = perturb_demand(rng, rng.uniform(lows, highs), cfg.demand_noise)
    out = sample_output_bytes(rng, types)
    own_in = sample_output_bytes(rng, types)
    cold = rng.uniform(0.0, cfg.cold_start_max_s, n)
    inp = np.zeros(n)
    has_parent = np.zeros(n, dtype=bool)
    for p, c in edges:
        inp[c] += out[p]
        has_parent[c] = True
    inp = np.where(has_parent, inp, own_in)
    return [
        TaskSpec(
            name=names[i],
            type=types[i],
            duration_s=float(dur[i]),
            cpu_cores=float(demand[i, 0]),
            mem_gb=float(demand[i, 1]),
            input_bytes=float(inp[i]),
            output_bytes=float(out[i]),
            cold_start_s=float(cold[i]),
            family=families[i] if families is not None else "",
        )
        for i in range(n)
    ]


class WorkloadGenerator:
    """Draws workflows per `WorkloadConfig` for a cluster, from one random generator."""

    def __init__(
        self,
        cfg: WorkloadConfig,
        cluster: ClusterConfig,
        rng: np.random.Generator,
        truth: TruthConfig | None = None,
    ) -> None:
        unknown = [t for t in cfg.templates if t not in TEMPLATES]
        if unknown:
            raise ValueError(f"unknown templates {unknown}; choose from {sorted(TEMPLATES)}")
        self.cfg = cfg
        self.cluster = cluster
        self.truth = truth if truth is not None else TruthConfig()
        self.rng = rng
        self._mix_types = [TaskType[k.upper()] for k in cfg.type_mix]
        shares = np.array(list(cfg.type_mix.values()), dtype=float)
        self._mix_p = shares / shares.sum()

    def _shape(
        self, size: int
    ) -> tuple[list[TaskType], list[tuple[int, int]], list[str], str, list[str]]:
        """Types, edges, names, source and the family of each task.

        A template task's family is the template and its stage ("mapreduce:map"); a layered
        DAG's task is one of `families_per_type` families of its type ("layered:cpu-3")."""
        cfg, rng = self.cfg, self.rng
        if cfg.templates and rng.random() < cfg.template_share:
            name = cfg.templates[int(rng.integers(len(cfg.templates)))]
            types, edges, names = TEMPLATES[name](rng, size)
            families = [f"{name}:{_STAGE_NUMBER.sub('', x)}" for x in names]
            return types, edges, names, f"template:{name}", families
        alpha = float(rng.uniform(*cfg.alpha))
        beta = float(rng.uniform(*cfg.beta))
        edges = layered_dag(rng, size, cfg.max_out, alpha, beta)
        picks = rng.choice(len(self._mix_types), size=size, p=self._mix_p)
        types = [self._mix_types[int(k)] for k in picks]
        kinds = rng.integers(cfg.families_per_type, size=size)
        families = [
            f"layered:{TASK_TYPE_NAMES[t]}-{int(k)}" for t, k in zip(types, kinds, strict=True)
        ]
        return types, edges, [f"task-{i}" for i in range(size)], "layered", families

    def make_workflow(self, wf_id: str, arrival_s: float = 0.0) -> Workflow:
        """One random workflow: a template (share `template_share`) or a layered DAG."""
        cfg, rng = self.cfg, self.rng
        size = int(rng.integers(cfg.size[0], cfg.size[1] + 1))
        types, edges, names, source, families = self._shape(size)
        edges = drop_edges(rng, len(types), edges, float(rng.uniform(*cfg.edge_drop)))
        tasks = sample_tasks(rng, cfg, types, names, edges, families)
        return Workflow.build(
            wf_id,
            tasks,
            edges,
            arrival_s=arrival_s,
            slack=float(rng.uniform(*cfg.slack)),
            source=source,
        )

    def generate(self, n: int | None = None, start_s: float = 0.0) -> list[Workflow]:
        """`n` (default `cfg.workflows`) workflows "wf-00000".. with Poisson arrivals at the
        rate that offers `cfg.load` of the cluster (see `arrival_rate`)."""
        count = self.cfg.workflows if n is None else n
        if count < 1:
            raise ValueError(f"n must be >= 1, got {count}")
        wfs = [self.make_workflow(f"wf-{i:05d}") for i in range(count)]
        rate = arrival_rate(self.cfg.load, self.cluster, wfs, self.truth)
        return retime(wfs, rate, self.rng, start_s)


def total_cores(cluster: ClusterConfig) -> float:
    """Sum of cores over all nodes of the cluster."""
    return float(sum(g.cores * g.count for g in cluster.groups))


# What heft_history holds beyond the expected use: it reserves the p90 of use +15% rounded up
# to a histogram bucket, never below the minimum fractions, and spills onto slower node kinds
# when the fastest are busy. Calibrated on 5 held-out seeds (docs/concepts/world.md) so that its
# time-averaged reserved share is within 0.1 of `load` at 0.5, 0.8 and 0.95 (1.14 centres
# load 0.5 best, but leaves 0.95 short: heft_history cannot pack much above 0.9).
RESERVATION_OVERHEAD = 1.10


def offered_node_s(
    cluster: ClusterConfig, workflows: Sequence[Workflow], truth: TruthConfig | None = None
) -> np.ndarray:
    """Node-seconds each workflow occupies when every task runs on the node kind that runs
    its type fastest, using what it truly uses on average (`truth.expected_ratios`).

    A task occupies its dominant share of such a node - max(CPU share, memory share) of its
    expected real use, floored by the minimum reservations 0.1 and 0.2 - for its cold start
    plus its expected real compute time at that speed, x RESERVATION_OVERHEAD for what a
    history-aware scheduler reserves beyond the expected use. Divided by the cluster's node
    count and the time between arrivals, it is the share of the cluster such a scheduler
    keeps reserved (measured on heft_history; docs/concepts/world.md).
    """
    cpu_r, mem_r, rt_r = expected_ratios(truth if truth is not None else TruthConfig())
    kinds = [g for g in cluster.groups if g.count]
    # per task type: the fastest node kind's (cores, memory GB, speed)
    best = []
    for t in TASK_TYPE_NAMES:
        g = max(kinds, key=lambda g: cluster.speed[g.kind][t])
        best.append((g.cores, g.mem_gb, cluster.speed[g.kind][t]))
    shape = np.array(best)
    out = np.empty(len(workflows))
    for k, wf in enumerate(workflows):
        spec = np.array([(t.cpu_cores, t.mem_gb, t.duration_s, t.cold_start_s) for t in wf.tasks])
        node = shape[[int(t.type) for t in wf.tasks]]
        share = np.maximum(
            np.clip(spec[:, 0] * cpu_r / node[:, 0], 0.1, 0.9),
            np.clip(spec[:, 1] * mem_r / node[:, 1], 0.2, 0.8),
        )
        out[k] = float((share * (spec[:, 3] + spec[:, 2] * rt_r / node[:, 2])).sum())
    return out * RESERVATION_OVERHEAD


def arrival_rate(
    load: float,
    cluster: ClusterConfig,
    workflows: Sequence[Workflow],
    truth: TruthConfig | None = None,
) -> float:
    """Workflows per second so that the offered load is `load` x the cluster's nodes:
    load x n_nodes / mean(offered_node_s) - see `offered_node_s` for what a task occupies."""
    if load <= 0:
        raise ValueError(f"load must be > 0, got {load}")
    if not workflows:
        raise ValueError("need at least one workflow to estimate the mean work")
    return load * cluster.n_nodes / float(offered_node_s(cluster, workflows, truth).mean())


def retime(
    workflows: Sequence[Workflow], rate: float, rng: np.random.Generator, start_s: float = 0.0
) -> list[Workflow]:
    """Copies of `workflows` (in order) with Poisson arrivals at `rate` per second after
    `start_s`; the first arrives at start_s + Exp(rate). Tasks and edges are shared."""
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    gaps = rng.exponential(1.0 / rate, len(workflows))
    arrivals = start_s + np.cumsum(gaps)
    return [replace(wf, arrival_s=float(a)) for wf, a in zip(workflows, arrivals, strict=True)]
