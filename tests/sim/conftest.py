"""Small scenarios that run in well under a second."""

from __future__ import annotations

from dataclasses import replace

import pytest

from dagsched.sim.config import (
    ClusterConfig,
    FaultConfig,
    ScenarioConfig,
    TruthConfig,
    WorkloadConfig,
)


def small_scenario(
    nodes: int = 8,
    workflows: int = 30,
    load: float = 0.8,
    node_failure_per_hour: float = 0.032,
    transient: float = 0.01,
    exact: bool = False,
) -> ScenarioConfig:
    """A small scenario; `exact` runs tasks on exactly what they declare (no hidden truth)."""
    return ScenarioConfig(
        cluster=ClusterConfig().scaled(nodes),
        faults=FaultConfig(
            node_failure_per_hour=node_failure_per_hour, transient_task_failure=transient
        ),
        workload=WorkloadConfig(workflows=workflows, load=load, size=(4, 20)),
        truth=TruthConfig(exact=exact),
    )


@pytest.fixture
def scenario() -> ScenarioConfig:
    return small_scenario()


@pytest.fixture
def faulty_scenario() -> ScenarioConfig:
    base = small_scenario(workflows=40)
    return replace(
        base,
        faults=FaultConfig(
            node_failure_per_hour=2.0, repair_mean_s=300, transient_task_failure=0.05
        ),
    )
