"""The MCTS planner finishes under faults, never touches the real simulator, and plans."""

from __future__ import annotations

from dagsched.sim.engine import Simulator
from dagsched.sim.mcts import MCTSPolicy
from dagsched.sim.runner import generate_workflows, make_policy, simulate
from tests.sim.conftest import small_scenario


def test_runs_to_the_end_with_faults_on() -> None:
    # rollouts must end on fault events while a workflow stays open
    sc = small_scenario(nodes=8, workflows=3, node_failure_per_hour=2.0)
    m = simulate(sc, MCTSPolicy(budget=4, horizon=8), seed=1)
    assert m["workflows"] == 3
    assert m["decisions"] >= m["tasks"] > 0


def test_rollouts_leave_the_real_simulator_untouched() -> None:
    sc = small_scenario(nodes=8, workflows=4)
    sim = Simulator(sc, generate_workflows(sc, 2), seed=2, keep_log=True)
    batch = sim.advance()
    assert batch is not None

    def state() -> tuple[object, ...]:
        c = sim.cluster
        tasks = [(t.key, t.state, t.node) for r in sim.active.values() for t in r.tasks]
        return (sim.now, sim.summary(), list(c.free_cores), list(c.queue_len), tasks)

    before = state()
    decisions = MCTSPolicy(budget=6, horizon=10).decide(sim, batch)
    assert state() == before
    assert len(decisions) == len(batch)
    assert all(sim.cluster.alive[d.node] for d in decisions)


def test_planning_does_not_change_how_the_real_run_plays_out() -> None:
    # transient failures draw from the per-attempt generator: a fork must have its own
    sc = small_scenario(nodes=8, workflows=4, transient=0.3)
    wfs = generate_workflows(sc, 2)
    sim, twin = (Simulator(sc, wfs, seed=2, keep_log=True) for _ in range(2))
    batch, twin_batch = sim.advance(), twin.advance()
    assert batch is not None and twin_batch is not None
    decisions = MCTSPolicy(budget=6, horizon=10).decide(sim, batch)
    # from here the real simulator must play out exactly as its twin that never planned
    sim.apply(decisions, batch)
    twin.apply([d._replace(task=t) for d, t in zip(decisions, twin_batch, strict=True)], twin_batch)
    a = sim.run(make_policy("least_loaded", 0))
    b = twin.run(make_policy("least_loaded", 0))
    assert a == b and sim.log == twin.log
