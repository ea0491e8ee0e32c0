"""The MCTS planner finishes under faults, never touches the real simulator, and plans."""

from __future__ import annotations

from dagsched.sim.engine import Simulator
from dagsched.sim.mcts import MCTSPolicy
from dagsched.sim.runner import generate_workflows, simulate
from tests.sim.conftest import small_scenario


def test_runs_to_the_end_with_faults_on() -> None:
    # Regression: rollouts used to spin forever on fault events when a workflow stayed open.
    sc = small_scenario(nodes=8, workflows=3, node_failure_per_hour=2.0)
    m = simulate(sc, MCTSPolicy(budget=4, horizon=8), seed=1)
    assert m["workflows"] == 3
    assert m["decisions"] >= m["tasks"] > 0


def test_rollouts_leave_the_real_simulator_untouched() -> None:
    sc = small_scenario(nodes=8, workflows=4)
    wfs = generate_workflows(sc, 2)
    sim = Simulator(sc, wfs, seed=2, keep_log=True)
    batch = sim.advance()
    assert batch is not None
    before = (sim.now, sim.metrics.decisions, list(sim.cluster.free_cores), len(sim._heap))
    decisions = MCTSPolicy(budget=6, horizon=10).decide(sim, batch)
    after = (sim.now, sim.metrics.decisions, list(sim.cluster.free_cores), len(sim._heap))
    assert before == after
    assert len(decisions) == len(batch)
    assert all(sim.cluster.alive[d.node] for d in decisions)
