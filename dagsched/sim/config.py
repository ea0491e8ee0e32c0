"""Plain, frozen configuration of a simulated scenario: cluster, network, faults, workload, reward.

These are standard-library dataclasses so the simulator stays free of pydantic; the typed
settings object (`dagsched.settings`) validates them from YAML and the environment. Each
dataclass rejects unknown keys (`__pydantic_config__`) and checks its own ranges in
`__post_init__`, naming the offending field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from dagsched.core.view import NODE_KINDS
from dagsched.core.workflow import TASK_TYPE_NAMES

# Read by pydantic when these dataclasses are fields of a settings model: unknown keys are errors.
_FORBID: dict[str, Any] = {"extra": "forbid"}


def _check(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {msg}")


@dataclass(frozen=True)
class NodeGroup:
    """`count` identical nodes of one kind."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    kind: str
    count: int
    cores: float
    mem_gb: float
    gpu_mem_gb: float = 0.0
    disk_gb: float = 1000.0
    net_gbps: float = 25.0

    def __post_init__(self) -> None:
        _check(self.kind in NODE_KINDS, "kind", f"must be one of {NODE_KINDS}, got {self.kind!r}")
        _check(self.count >= 0, "count", "must be >= 0")
        _check(self.cores > 0, "cores", "must be > 0")
        _check(self.mem_gb > 0, "mem_gb", "must be > 0")
        _check(self.gpu_mem_gb >= 0, "gpu_mem_gb", "must be >= 0")
        _check(self.net_gbps > 0, "net_gbps", "must be > 0")


def _default_groups() -> tuple[NodeGroup, ...]:
    return (
        NodeGroup("cpu", 8, cores=32, mem_gb=128, net_gbps=25),
        NodeGroup("gpu", 8, cores=16, mem_gb=128, gpu_mem_gb=80, net_gbps=25),
        NodeGroup("io", 8, cores=16, mem_gb=64, disk_gb=8000, net_gbps=50),
        NodeGroup("mem", 8, cores=16, mem_gb=512, net_gbps=25),
    )


def _default_speed() -> dict[str, dict[str, float]]:
    # rows: node kind; columns: task type. A GPU task is ~16x faster on a GPU node than off it.
    return {
        "cpu": {"cpu": 1.5, "io": 0.8, "gpu": 0.25, "mem": 1.0},
        "gpu": {"cpu": 1.0, "io": 0.8, "gpu": 4.0, "mem": 1.0},
        "io": {"cpu": 0.8, "io": 2.5, "gpu": 0.25, "mem": 0.9},
        "mem": {"cpu": 1.0, "io": 0.9, "gpu": 0.25, "mem": 2.0},
    }


@dataclass(frozen=True)
class ClusterConfig:
    """Node shapes, per-type speed factors and the zone network."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    groups: tuple[NodeGroup, ...] = field(default_factory=_default_groups)
    speed: dict[str, dict[str, float]] = field(default_factory=_default_speed)
    zones: int = 4
    intra_zone_latency_ms: float = 1.0
    inter_zone_latency_ms: tuple[float, float] = (10.0, 100.0)
    inter_zone_gbps: tuple[float, float] = (1.0, 10.0)

    def __post_init__(self) -> None:
        _check(sum(g.count for g in self.groups) > 0, "groups", "the cluster needs >= 1 node")
        for kind in {g.kind for g in self.groups}:
            row = self.speed.get(kind)
            _check(row is not None, "speed", f"no speed row for node kind {kind!r}")
            assert row is not None
            for t in TASK_TYPE_NAMES:
                _check(row.get(t, 0) > 0, "speed", f"speed[{kind}][{t}] must be > 0")
        _check(self.zones >= 1, "zones", "must be >= 1")
        lo, hi = self.inter_zone_latency_ms
        _check(0 <= lo <= hi, "inter_zone_latency_ms", "must be [low, high] with 0 <= low <= high")
        lo, hi = self.inter_zone_gbps
        _check(0 < lo <= hi, "inter_zone_gbps", "must be [low, high] with 0 < low <= high")

    @property
    def n_nodes(self) -> int:
        return sum(g.count for g in self.groups)

    def scaled(self, n_nodes: int) -> ClusterConfig:
        """The same mix of node kinds at another total size (at least one node per group)."""
        total = self.n_nodes
        groups = tuple(
            replace(g, count=max(1, round(g.count * n_nodes / total)))
            for g in self.groups
            if g.count
        )
        return replace(self, groups=groups)


@dataclass(frozen=True)
class FaultConfig:
    """Node crashes (Poisson per node-hour, exponential repair) and transient task failures."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    node_failure_per_hour: float = 0.032
    repair_mean_s: float = 600.0
    transient_task_failure: float = 0.01

    def __post_init__(self) -> None:
        _check(self.node_failure_per_hour >= 0, "node_failure_per_hour", "must be >= 0")
        _check(self.repair_mean_s > 0, "repair_mean_s", "must be > 0")
        _check(0 <= self.transient_task_failure < 1, "transient_task_failure", "must be in [0, 1)")

    @property
    def enabled(self) -> bool:
        return self.node_failure_per_hour > 0 or self.transient_task_failure > 0


@dataclass(frozen=True)
class WorkloadConfig:
    """How workflows are generated and how fast they arrive."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    workflows: int = 200
    load: float = 0.8
    size: tuple[int, int] = (8, 40)
    max_out: int = 4
    alpha: tuple[float, float] = (0.5, 1.5)
    beta: tuple[float, float] = (0.2, 1.0)
    template_share: float = 0.5
    templates: tuple[str, ...] = (
        "mapreduce",
        "spark_shuffle",
        "cicd_chain",
        "fork_join",
        "etl",
        "ml_training",
        "montage",
    )
    type_mix: dict[str, float] = field(
        default_factory=lambda: {"cpu": 0.45, "io": 0.2, "gpu": 0.15, "mem": 0.2}
    )
    base_duration_s: float = 20.0
    long_task_share: float = 0.2
    slack: tuple[float, float] = (1.5, 3.0)
    demand_noise: float = 0.15
    edge_drop: tuple[float, float] = (0.05, 0.10)
    cold_start_max_s: float = 30.0
    families_per_type: int = 6

    def __post_init__(self) -> None:
        _check(self.workflows >= 1, "workflows", "must be >= 1")
        _check(0 < self.load <= 2, "load", "must be in (0, 2]")
        _check(
            2 <= self.size[0] <= self.size[1], "size", "must be [low, high] with 2 <= low <= high"
        )
        _check(self.max_out >= 1, "max_out", "must be >= 1")
        _check(
            0 < self.alpha[0] <= self.alpha[1], "alpha", "must be [low, high] with 0 < low <= high"
        )
        _check(
            0 <= self.beta[0] <= self.beta[1], "beta", "must be [low, high] with 0 <= low <= high"
        )
        _check(0 <= self.template_share <= 1, "template_share", "must be in [0, 1]")
        _check(abs(sum(self.type_mix.values()) - 1) < 1e-6, "type_mix", "shares must sum to 1")
        _check(
            set(self.type_mix) <= set(TASK_TYPE_NAMES), "type_mix", f"keys from {TASK_TYPE_NAMES}"
        )
        _check(self.base_duration_s > 0, "base_duration_s", "must be > 0")
        _check(0 <= self.long_task_share <= 1, "long_task_share", "must be in [0, 1]")
        _check(
            1 <= self.slack[0] <= self.slack[1],
            "slack",
            "must be [low, high] with 1 <= low <= high",
        )
        _check(self.demand_noise >= 0, "demand_noise", "must be >= 0")
        lo, hi = self.edge_drop
        _check(0 <= lo <= hi < 1, "edge_drop", "must be [low, high] within [0, 1)")
        _check(self.cold_start_max_s >= 0, "cold_start_max_s", "must be >= 0")
        _check(self.families_per_type >= 1, "families_per_type", "must be >= 1")


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the per-decision reward terms; the deadline penalty grows with lateness."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    deadline: float = 0.4
    cost: float = 0.2
    fairness: float = 0.2
    stability: float = 0.1
    network: float = 0.15
    completion: float = 0.5

    def __post_init__(self) -> None:
        for name in ("deadline", "cost", "fairness", "stability", "network", "completion"):
            _check(getattr(self, name) >= 0, name, "must be >= 0")


@dataclass(frozen=True)
class TruthConfig:
    """Hidden truth: how much of its request a task really uses and how long it really runs.

    Every task belongs to a family (a recurring kind of task). Each family draws a median
    ratio per quantity from the run's seed, lognormally around the medians below with the
    family spread; each task draws its own ratio around its family's with the task spread.
    Defaults and their sources (docs/concepts/world.md):

    - CPU use (average cores used / cores requested): median 0.5, wide spread - Twitter via
      Quasar (reservations near 80% of the cluster, utilisation below 20%), Google Autopilot
      (46% slack for manually set limits), Alibaba 2018 (plans "only a reference").
    - Memory peak (peak / request): median 0.7, about 7% of tasks above their request
      (total log-spread 0.24) - Autopilot's 23-46% slack; Alibaba's instances above plan.
    - Runtime (actual / declared): median 1, log-spread 0.48 in all, so about 15% of tasks
      are off by 2x or more - 3Sigma (EuroSys 2018): 8-23% of jobs off by 2x or more.

    `exact: true` makes every ratio 1: tasks use exactly what they declare (regression runs).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    exact: bool = False
    cpu_use_median: float = 0.5
    cpu_use_family_sigma: float = 0.5
    cpu_use_task_sigma: float = 0.2
    mem_peak_median: float = 0.7
    mem_peak_family_sigma: float = 0.2
    mem_peak_task_sigma: float = 0.13
    runtime_median: float = 1.0
    runtime_family_sigma: float = 0.4
    runtime_task_sigma: float = 0.27

    def __post_init__(self) -> None:
        for name in ("cpu_use_median", "mem_peak_median", "runtime_median"):
            _check(0 < getattr(self, name) <= 10, name, "must be in (0, 10]")
        for name in (
            "cpu_use_family_sigma",
            "cpu_use_task_sigma",
            "mem_peak_family_sigma",
            "mem_peak_task_sigma",
            "runtime_family_sigma",
            "runtime_task_sigma",
        ):
            _check(0 <= getattr(self, name) <= 3, name, "must be in [0, 3]")


@dataclass(frozen=True)
class DriftConfig:
    """A change of the cluster mid-run that policies are not told about.

    At `at_s` simulated seconds, a `node_share` of the nodes (every k-th node, so each kind is
    hit alike) run `slowdown` times slower than their advertised speed, and their node-failure
    rate and transient task-failure probability are multiplied by `failure_mult`.
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    at_s: float
    node_share: float = 0.25
    slowdown: float = 3.0
    failure_mult: float = 5.0

    def __post_init__(self) -> None:
        _check(self.at_s >= 0, "at_s", "must be >= 0")
        _check(0 < self.node_share <= 1, "node_share", "must be in (0, 1]")
        _check(self.slowdown >= 1, "slowdown", "must be >= 1")
        _check(self.failure_mult >= 1, "failure_mult", "must be >= 1")

    def nodes(self, n: int) -> tuple[int, ...]:
        """The drifted nodes of an `n`-node cluster: every k-th, about `node_share` of them."""
        step = max(1, round(1 / self.node_share))
        return tuple(range(0, n, step))


@dataclass(frozen=True)
class ShiftConfig:
    """Production that differs from the training world where the observation cannot see it.

    From `at_s` simulated seconds on (0: from the start), unannounced, each effect switched
    off at its neutral value (docs/concepts/world.md):

    - `oom_restart_s`: an attempt that follows an OOM kill of the same task first restarts
      for this long (the state it had built was lost), holding its reservation, before it
      computes. An OOM kill costs more than in training, so the right memory margin is larger.
    - `mem_spread`: the spread of each task's memory peak around its family's median is
      multiplied by this, for workflows arriving from `at_s` on; more tasks peak above what
      their family's history predicts at the trained margin.
    - `neighbour_slowdown`: a task starting on a node whose measured CPU use is a share `u`
      of its cores computes `1 + neighbour_slowdown x u` times slower (noisy neighbours;
      there is no interference in training).
    - `release_every`: each task family ships a new release on average every this many of
      its workflows (0: never), for workflows arriving from `at_s` on. A release is a new
      family name (`name@r2`) whose use, peak and runtime are drawn afresh: history knows
      nothing of it, and its first tasks run on the declared request or a guess. Releases
      never stop, so cold families keep arriving at steady state, not only at the start.
      The job queue's stream applies them (`sim.runner.released`: the generated workloads);
      workflows handed to the simulator directly keep their names.

    Policies are not told: no view, observation or history carries any of it. They learn it
    from outcomes only (later finishes, OOM kills, measured runtimes).
    """

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    at_s: float = 0.0
    oom_restart_s: float = 0.0
    mem_spread: float = 1.0
    neighbour_slowdown: float = 0.0
    release_every: float = 0.0

    def __post_init__(self) -> None:
        _check(self.at_s >= 0, "at_s", "must be >= 0")
        _check(self.oom_restart_s >= 0, "oom_restart_s", "must be >= 0")
        _check(1 <= self.mem_spread <= 10, "mem_spread", "must be in [1, 10]")
        _check(self.neighbour_slowdown >= 0, "neighbour_slowdown", "must be >= 0")
        _check(
            self.release_every == 0 or self.release_every >= 1,
            "release_every",
            "must be 0 (off) or >= 1",
        )


# The shifted world's effects as the `shift` profile sets them (configs/shift.yaml), from t=0:
# an OOM kill costs an hour's restart, and families keep shipping new releases, so tasks of a
# family history has not measured yet arrive all run long. Wider memory peaks (mem_spread 2)
# were tried first; they raise what every policy must reserve, so the cluster overloaded and
# no policy could win.
PRODUCTION_SHIFT = ShiftConfig(oom_restart_s=3600.0, release_every=200.0)


@dataclass(frozen=True)
class ScenarioConfig:
    """Everything a simulation run needs besides the policy and the seed."""

    __pydantic_config__: ClassVar[dict[str, Any]] = _FORBID

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    reward: RewardWeights = field(default_factory=RewardWeights)
    truth: TruthConfig = field(default_factory=TruthConfig)
    drift: DriftConfig | None = None
    shift: ShiftConfig | None = None
