"""Training scenarios: a curriculum over DAG size and load, templates and random DAGs, faults on.

Stage k of the curriculum is reached after `stage_fraction[k]` of training; each episode then
draws its load and DAG sizes within the stage's range. Cluster sizes vary too (16-48 nodes)
so the shared node scorer never overfits one cluster shape.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from dagsched.core.workflow import Workflow
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.workload import WorkloadGenerator


@dataclass(frozen=True)
class Stage:
    """One step of the curriculum."""

    starts_at: float  # fraction of training
    size: tuple[int, int]
    load: tuple[float, float]


STAGES: tuple[Stage, ...] = (
    Stage(0.0, (4, 16), (0.4, 0.6)),
    Stage(0.25, (8, 30), (0.6, 0.85)),
    Stage(0.5, (8, 40), (0.5, 0.95)),
)
CLUSTER_SIZES = (16, 32, 48)


class Curriculum:
    """Makes `(scenario, workflows)` episodes; `progress` (0..1) is set by the trainer."""

    def __init__(
        self,
        base: ScenarioConfig,
        workflows_per_episode: int = 24,
        load: tuple[float, float] | None = None,
    ) -> None:
        self.base = base
        self.workflows = workflows_per_episode
        self.load = load  # replaces every stage's load range when set
        self.progress = 0.0

    def stage(self) -> Stage:
        return [s for s in STAGES if s.starts_at <= self.progress][-1]

    def __call__(self, episode_seed: int) -> tuple[ScenarioConfig, list[Workflow]]:
        rng = np.random.default_rng(np.random.SeedSequence([episode_seed, 11]))
        st = self.stage()
        nodes = int(rng.choice(CLUSTER_SIZES))
        workload = replace(
            self.base.workload,
            workflows=self.workflows,
            size=st.size,
            load=float(rng.uniform(*(self.load or st.load))),
        )
        scenario = replace(self.base, cluster=self.base.cluster.scaled(nodes), workload=workload)
        gen = WorkloadGenerator(workload, scenario.cluster, rng, scenario.truth)
        return scenario, gen.generate()
