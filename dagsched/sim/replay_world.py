"""A calibrated replay of a window of recorded traffic: the world as the daemon saw it.

`ReplayWorld` holds only what serving can know: the workflows that arrived (with their
arrival times), the cluster from the nodes' heartbeats, the per-family history of measured
outcomes, and what execution events revealed (the transient-failure and node-crash rates,
and the time a retry loses after an OOM kill). `play` runs one policy over it in the
simulator with the world's tasks drawn from the learned history (`sim.learned_truth`), never
from the hidden truth, and returns per-workflow outcomes of the workflows the window counts
(the warm-up workflows before them and the later arrivals after them only load the
cluster; a replay ends once the counted workflows have).

Two policies played with the same seed meet the same arrivals, the same per-task ratios, the
same node crashes (the engine's streams are per concern) and the same transient failures,
task by task (each task's drawn at its arrival, not as attempts start, whose order the
policies change): common random numbers.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from dagsched.core.history import FamilyStats, History
from dagsched.core.workflow import Workflow
from dagsched.sim.config import ClusterConfig, NodeGroup, ScenarioConfig, ShiftConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.learned_truth import LearnedTruth
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import Decision, Policy, TaskRun


@dataclass(frozen=True)
class NodeSpec:
    """One node as its heartbeat describes it."""

    kind: str
    zone: int
    cores: float
    mem_gb: float
    gpu_mem_gb: float = 0.0
    net_gbps: float = 25.0


def cluster_from_nodes(nodes: Sequence[NodeSpec], base: ClusterConfig) -> ClusterConfig:
    """The cluster of `nodes` (identical shapes grouped), with `base`'s speed table and
    network ranges; `base` itself when no node is known."""
    if not nodes:
        return base
    counts: dict[tuple[str, float, float, float, float], int] = {}
    for n in nodes:
        key = (n.kind, n.cores, n.mem_gb, n.gpu_mem_gb, n.net_gbps)
        counts[key] = counts.get(key, 0) + 1
    groups = tuple(
        NodeGroup(kind, count, cores=cores, mem_gb=mem, gpu_mem_gb=gpu, net_gbps=net)
        for (kind, cores, mem, gpu, net), count in sorted(counts.items())
    )
    zones = max(1, len({n.zone for n in nodes}))
    return replace(base, groups=groups, zones=zones)


@dataclass(frozen=True)
class ReplayWorld:
    """Everything one window's replay plays on (see the module docstring)."""

    workflows: tuple[Workflow, ...]  # warm-up, the window, the later arrivals, by arrival
    counted: frozenset[str]  # the window's workflow ids: what a replay reports on
    scenario: ScenarioConfig  # cluster, faults and the OOM restart, as observed
    families: Mapping[str, FamilyStats] = field(default_factory=dict)  # the learned truth
    history: Mapping[str, FamilyStats] = field(default_factory=dict)  # what policies start with
    # each task's transient failures drawn at its arrival (`Simulator(keyed_attempts=...)`),
    # so that the versions compared on one seed meet them task by task
    keyed_attempts: bool = True

    def __post_init__(self) -> None:
        if not self.counted:
            raise ValueError("a replay window needs at least one workflow")

    @staticmethod
    def build(
        workflows: Sequence[Workflow],
        counted: Sequence[str],
        base: ScenarioConfig,
        *,
        nodes: Sequence[NodeSpec] = (),
        families: Mapping[str, FamilyStats] | None = None,
        history: Mapping[str, FamilyStats] | None = None,
        transient_failure: float = 0.0,
        node_failure_per_hour: float = 0.0,
        oom_restart_s: float = 0.0,
        oom_restart_from_s: float = 0.0,
    ) -> ReplayWorld:
        """A world from what was observed; `base` gives what no event carries (speed table,
        network ranges, reward weights). `families` is what the tasks are drawn from;
        `history` what the policies know when the replay starts (default: `families`); the
        retry after an OOM kill restarts for `oom_restart_s` from `oom_restart_from_s` on."""
        faults = replace(
            base.faults,
            transient_task_failure=min(max(transient_failure, 0.0), 0.5),
            node_failure_per_hour=max(node_failure_per_hour, 0.0),
        )
        shift = (
            ShiftConfig(at_s=max(0.0, oom_restart_from_s), oom_restart_s=oom_restart_s)
            if oom_restart_s > 0
            else None
        )
        sc = replace(
            base,
            cluster=cluster_from_nodes(nodes, base.cluster),
            faults=faults,
            drift=None,
            shift=shift,
        )
        wfs = tuple(sorted(workflows, key=lambda w: w.arrival_s))
        fam = dict(families or {})
        return ReplayWorld(
            wfs, frozenset(counted), sc, fam, dict(history if history is not None else fam)
        )


# a workflow that ran out of retries counts as taking at least this many deadlines when
# versions are compared (it would otherwise look fast: it ended at its failure)
FAILED_JCT_RATIO = 2.0


@dataclass
class ReplayResult:
    """One replay of one policy: per counted workflow JCT and SLA, and the attempts' reward;
    `failed` holds the deadline of each workflow that ran out of retries."""

    jct_s: dict[str, float] = field(default_factory=dict)
    met: dict[str, bool] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)
    failed: dict[str, float] = field(default_factory=dict)

    @property
    def mean_jct_s(self) -> float:
        """Mean JCT as observed: a failed workflow at the time it failed."""
        return float(np.mean(list(self.jct_s.values()))) if self.jct_s else 0.0

    @property
    def judged_jct_s(self) -> float:
        """Mean JCT as versions are compared: a failed workflow at least `FAILED_JCT_RATIO`
        deadlines (as the live A/B's speed counts it)."""
        if not self.jct_s:
            return 0.0
        dl = self.failed
        return float(np.mean([
            max(j, FAILED_JCT_RATIO * dl[i]) if i in dl else j for i, j in self.jct_s.items()
        ]))  # fmt: skip

    @property
    def sla(self) -> float:
        return float(np.mean(list(self.met.values()))) if self.met else 0.0

    @property
    def reward(self) -> float:
        return float(np.mean(self.rewards)) if self.rewards else 0.0


class WorkflowEnds:
    """The counted workflows' ends (JCT, SLA met, failure) and their attempts' rewards, from
    the engine's outcome hook (as `learner.sim_loop` reads them)."""

    def __init__(self, counted: frozenset[str]) -> None:
        self.counted = counted
        self.result = ReplayResult()
        self.sim: Simulator | None = None  # set once the simulator that calls it exists

    def __call__(self, t: TaskRun, o: TaskOutcome, reward: float) -> None:
        wf = t.run.wf
        if wf.id not in self.counted or wf.id in self.result.jct_s:
            return
        self.result.rewards.append(reward)
        failed = o.failed and t.failures + 1 > t.max_retries
        if not (failed or (not o.failed and t.run.remaining == 1)):
            return
        assert self.sim is not None
        end = self.sim.now
        self.result.jct_s[wf.id] = end - wf.arrival_s
        if failed:
            self.result.failed[wf.id] = wf.deadline_s
        self.result.met[wf.id] = not failed and end <= wf.arrival_s + wf.deadline_s + 1e-9


PolicyFactory = Callable[[int], Policy]  # a fresh policy for one replay, from its seed


class AsServed:
    """Policies sharing one cluster as they did when the traffic was served: the tasks of a
    workflow in `served_by` are decided by the policy it maps to, every other task by
    `main`. Each decides its share of a batch from the same state, as daemon arms do."""

    def __init__(self, main: Policy, served_by: Mapping[str, Policy]) -> None:
        self.main, self.served_by = main, served_by
        names = dict.fromkeys(p.name for p in (main, *served_by.values()))
        self.name = "+".join(names)

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        shares: dict[int, tuple[Policy, list[TaskRun]]] = {id(self.main): (self.main, [])}
        for t in ready:
            policy = self.served_by.get(t.run.wf.id, self.main)
            shares.setdefault(id(policy), (policy, []))[1].append(t)
        return [d for policy, mine in shares.values() if mine for d in policy.decide(sim, mine)]


class AsServedFactory:
    """A factory of `AsServed` policies: for each seed, one fresh policy per distinct
    factory, `main`'s for the workflows `served_by` does not name. It pickles when its
    factories do (replays in worker processes: `sim.replay_pool`)."""

    def __init__(self, main: PolicyFactory, served_by: Mapping[str, PolicyFactory]) -> None:
        self.main, self.served_by = main, dict(served_by)

    def __call__(self, seed: int) -> Policy:
        made: dict[int, Policy] = {}
        for f in self.served_by.values():
            if id(f) not in made:
                made[id(f)] = f(seed)
        return AsServed(self.main(seed), {i: made[id(f)] for i, f in self.served_by.items()})


def as_served(main: PolicyFactory, served_by: Mapping[str, PolicyFactory]) -> PolicyFactory:
    """`AsServedFactory(main, served_by)`."""
    return AsServedFactory(main, served_by)


def play(world: ReplayWorld, policy: Policy, seed: int) -> ReplayResult:
    """One replay of `policy` over `world` with seed `seed` (the common random numbers)."""
    tracker = WorkflowEnds(world.counted)
    history = History()
    history.families = copy.deepcopy(dict(world.history))
    sim = Simulator(
        world.scenario,
        world.workflows,
        seed=seed,
        on_outcome=tracker,
        truth=LearnedTruth(world.families),
        history=history,
        keyed_attempts=world.keyed_attempts,
    )
    tracker.sim = sim
    ended = tracker.result.jct_s
    # the uncounted arrivals after the window only load it: stop once the counted have ended
    while len(ended) < len(world.counted) and (batch := sim.advance()) is not None:
        sim.apply(policy.decide(sim, batch), batch)
    return tracker.result
