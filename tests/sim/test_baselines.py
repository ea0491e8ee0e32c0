"""Baselines against each other, and the reservation rule they share."""

from __future__ import annotations

import numpy as np
import pytest

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import simulate
from tests.sim.conftest import small_scenario

SEEDS = (0, 1, 2, 3)


def _mean(scenario: ScenarioConfig, policy: str, key: str) -> float:
    return float(np.mean([simulate(scenario, policy, seed=s)[key] for s in SEEDS]))


@pytest.fixture(scope="module")
def scenario16() -> ScenarioConfig:
    return small_scenario(nodes=16, workflows=60)


@pytest.mark.parametrize("good", ["heft", "least_loaded"])
def test_informed_baselines_beat_random(scenario16: ScenarioConfig, good: str) -> None:
    assert _mean(scenario16, good, "sla_attainment") > _mean(scenario16, "random", "sla_attainment")
    assert _mean(scenario16, good, "mean_jct_s") < _mean(scenario16, "random", "mean_jct_s")


def test_baselines_reserve_their_demand_clamped() -> None:
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import generate_workflows, make_policy

    sc = small_scenario(workflows=10, node_failure_per_hour=0.0)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    seen = []

    policy = make_policy("least_loaded", 0)

    class Spy:
        name = "spy"

        def decide(self, s, ready):  # type: ignore[no-untyped-def]
            out = policy.decide(s, ready)
            seen.extend(out)
            return out

    sim.run(Spy())
    assert seen
    c = sim.cluster
    for d in seen:
        want_cpu = min(max(d.task.spec.cpu_cores / c.cores[d.node], CPU_BOUNDS[0]), CPU_BOUNDS[1])
        want_mem = min(max(d.task.spec.mem_gb / c.mem_gb[d.node], MEM_BOUNDS[0]), MEM_BOUNDS[1])
        assert d.cpu == pytest.approx(want_cpu)
        assert d.mem == pytest.approx(want_mem)


def test_heft_prefers_fast_nodes_for_gpu_tasks() -> None:
    """HEFT is speed-aware: GPU tasks land on GPU nodes far more often than at random."""
    from dagsched.core.workflow import TaskType
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import generate_workflows, make_policy

    sc = small_scenario(nodes=16, workflows=40, node_failure_per_hour=0.0)
    share = {}
    for name in ("heft", "random"):
        sim = Simulator(sc, generate_workflows(sc, 5), seed=5, keep_log=True)
        sim.run(make_policy(name, 5))
        assert sim.log is not None
        wfs = {wf.id: wf for wf in generate_workflows(sc, 5)}
        gpu_rows = [r for r in sim.log if wfs[r[0]].tasks[r[1]].type == TaskType.GPU]
        on_gpu = [r for r in gpu_rows if sim.cluster.nodes[r[3]].kind == "gpu"]
        share[name] = len(on_gpu) / len(gpu_rows)
    assert share["heft"] > share["random"] + 0.3
