"""The simulator's contract: determinism, capacity, precedence, accounting, faults."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import replace

import pytest

from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.sim.config import FaultConfig, ScenarioConfig
from dagsched.sim.engine import PolicyError, Simulator
from dagsched.sim.runner import POLICY_NAMES, generate_workflows, make_policy
from dagsched.sim.runs import Decision, TaskRun
from tests.sim.conftest import small_scenario


def _run(scenario: ScenarioConfig, policy: str, seed: int = 0) -> Simulator:
    sim = Simulator(scenario, generate_workflows(scenario, seed), seed=seed, keep_log=True)
    sim.run(make_policy(policy, seed))
    return sim


def test_same_seed_same_bytes(faulty_scenario: ScenarioConfig) -> None:
    a, b = _run(faulty_scenario, "least_loaded", 3), _run(faulty_scenario, "least_loaded", 3)
    assert json.dumps(a.summary(), sort_keys=True) == json.dumps(b.summary(), sort_keys=True)
    assert json.dumps(a.log) == json.dumps(b.log)
    c = _run(faulty_scenario, "least_loaded", 4)
    assert json.dumps(c.log) != json.dumps(a.log)


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_invariants_under_faults(faulty_scenario: ScenarioConfig, policy: str) -> None:
    sim = _run(faulty_scenario, policy, seed=1)
    assert sim.log is not None
    cluster = sim.cluster
    # 1. no node ever holds more than its capacity (sweep over attempt intervals)
    by_node: dict[int, list[tuple[float, int, float, float]]] = defaultdict(list)
    for _wf, _i, _a, node, start, _cs, end, _o, cores, mem, *_ in sim.log:
        by_node[node] += [(start, 1, cores, mem), (end, 0, -cores, -mem)]
    for node, events in by_node.items():
        used_c = used_m = 0.0
        for _t, _k, dc, dm in sorted(events):  # ends sort before starts at the same time
            used_c += dc
            used_m += dm
            assert used_c <= cluster.cores[node] + 1e-6
            assert used_m <= cluster.mem_gb[node] + 1e-6
    # 2. no task computes before its parents finished and their outputs arrived
    done = {(r.wf_id, r.idx): (r.node, r.end_s) for r in sim.log if r.outcome == "done"}
    wfs = {wf.id: wf for wf in generate_workflows(faulty_scenario, 1)}
    for wf_id, i, _a, node, start, compute_start, _e, outcome, _c, _m, *_ in sim.log:
        if outcome == "cancelled" and compute_start > _e:
            continue
        wf = wfs[wf_id]
        for p in wf.parents[i]:
            p_node, p_end = done[(wf_id, p)]
            xfer = cluster.network.transfer_s(p_node, node, wf.tasks[p].output_bytes)
            assert start >= p_end - 1e-9
            assert compute_start >= p_end + xfer + wf.tasks[i].cold_start_s - 1e-6
    # 3. every workflow ended, finished or failed, and the counts add up
    m = sim.summary()
    assert sim.finished and not sim.active
    assert m["workflows"] == faulty_scenario.workload.workflows
    outcomes = [row[7] for row in sim.log]
    assert m["tasks"] == outcomes.count("done")
    assert m["task_failures"] == sum(outcomes.count(k) for k in ("oom", "transient", "node_down"))
    assert m["oom_kills"] == outcomes.count("oom")
    finished = m["workflows"] - m["workflows_failed"]
    tasks_of_finished = sum(
        wf.size for wf in wfs.values() if all((wf.id, i) in done for i in range(wf.size))
    )
    assert finished == sum(
        1 for wf in wfs.values() if all((wf.id, i) in done for i in range(wf.size))
    )
    assert m["tasks"] >= tasks_of_finished
    assert m["decisions"] >= len(sim.log)


def test_measured_node_failure_rate_matches_config() -> None:
    rate = 4.0  # per node-hour: high so a short run sees hundreds of failures
    sc = small_scenario(
        nodes=32, workflows=150, load=0.5, node_failure_per_hour=rate, transient=0.0
    )
    sc = replace(
        sc,
        faults=FaultConfig(
            node_failure_per_hour=rate, repair_mean_s=120, transient_task_failure=0.0
        ),
    )
    sim = Simulator(sc, generate_workflows(sc, 7), seed=7)
    m = sim.run(make_policy("least_loaded", 7))
    expected = rate * m["node_hours"]
    assert expected > 100
    # Poisson: within 4 standard deviations
    assert abs(m["node_failures"] - expected) < 4 * expected**0.5


def test_no_faults_when_disabled() -> None:
    sc = small_scenario(node_failure_per_hour=0.0, transient=0.0)
    m = _run(sc, "least_loaded").summary()
    assert m["node_failures"] == 0
    assert m["task_failures"] == m["oom_kills"]


def _one_task_workflow(cores: float, mem: float, duration: float = 100.0) -> Workflow:
    spec = TaskSpec("t", TaskType.CPU, duration, cores, mem)
    return Workflow.build("wf", [spec], [], deadline_s=1e6)


class Fixed:
    """Places every task on node 0 with fixed fractions."""

    name = "fixed"

    def __init__(self, cpu: float, mem: float, retries: int = 1, node: int = 0) -> None:
        self.cpu, self.mem, self.retries, self.node = cpu, mem, retries, node

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        return [Decision(t, self.node, self.cpu, self.mem, self.retries) for t in ready]


def _quiet() -> ScenarioConfig:
    """No faults, and tasks use exactly what they declare."""
    return small_scenario(node_failure_per_hour=0.0, transient=0.0, exact=True)


def test_cpu_below_demand_runs_proportionally_slower() -> None:
    sc = _quiet()
    cores0 = sc.cluster.groups[0].cores
    speed = sc.cluster.speed[sc.cluster.groups[0].kind]["cpu"]
    wf = _one_task_workflow(cores=0.8 * cores0, mem=1.0)
    full = Simulator(sc, [wf], keep_log=True)
    full.run(Fixed(0.8, 0.5))
    half = Simulator(sc, [wf], keep_log=True)
    half.run(Fixed(0.4, 0.5))
    assert full.log and half.log
    t_full = full.log[0][6] - full.log[0][5]
    t_half = half.log[0][6] - half.log[0][5]
    assert t_full == pytest.approx(100.0 / speed)
    assert t_half == pytest.approx(2 * t_full)
    assert half.summary()["waste_core_s"] == pytest.approx(0.0, abs=1e-6)
    # reserving above demand is paid for and idle
    over = Simulator(sc, [_one_task_workflow(cores=0.1 * cores0, mem=1.0)])
    m = over.run(Fixed(0.9, 0.5))
    assert m["waste_core_s"] > 0.5 * m["cost_core_s"]


def test_memory_below_demand_is_oom_killed_until_retries_run_out() -> None:
    sc = _quiet()
    mem0 = sc.cluster.groups[0].mem_gb
    wf = _one_task_workflow(cores=1.0, mem=0.7 * mem0)
    sim = Simulator(sc, [wf], keep_log=True)
    m = sim.run(Fixed(0.2, 0.3, retries=2))
    assert m["oom_kills"] == 3  # first attempt + 2 retries
    assert m["workflows_failed"] == 1 and m["sla_attainment"] == 0.0
    ok = Simulator(sc, [wf]).run(Fixed(0.2, 0.8, retries=2))
    assert ok["oom_kills"] == 0 and ok["sla_attainment"] == 1.0


def test_task_waits_in_node_queue_when_reservation_does_not_fit() -> None:
    sc = _quiet()
    a, b = (_one_task_workflow(1.0, 1.0) for _ in range(2))
    b = replace(b, id="wf2")
    sim = Simulator(sc, [a, b], keep_log=True)
    sim.run(Fixed(0.6, 0.3))  # two 60% reservations cannot share node 0
    assert sim.log is not None
    first, second = sorted(sim.log, key=lambda r: r[4])
    assert second[4] == pytest.approx(first[6])  # starts when the first one ends


class ByPriority:
    """Node 0 for every task, 60% of its CPU each, priority from the workflow id's table."""

    name = "by_priority"

    def __init__(self, priority: dict[str, float]) -> None:
        self.priority = priority

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        return [Decision(t, 0, 0.6, 0.3, 1, self.priority[t.run.wf.id]) for t in ready]


def _starts(priority: dict[str, float]) -> list[str]:
    """The order four one-task workflows, arriving together on one node that runs one at a
    time, start in."""
    wfs = [replace(_one_task_workflow(1.0, 1.0), id=k) for k in ("a", "b", "c", "d")]
    sim = Simulator(_quiet(), wfs, keep_log=True)
    sim.run(ByPriority(priority))
    assert sim.log is not None
    return [r.wf_id for r in sorted(sim.log, key=lambda r: r.start_s)]


def test_node_queue_drains_by_priority_then_queue_order() -> None:
    # "a" takes the node at once; the rest queue and start by priority, ties in queue order
    assert _starts({"a": 0.0, "b": 0.0, "c": 0.0, "d": 0.0}) == ["a", "b", "c", "d"]
    assert _starts({"a": 0.0, "b": 0.1, "c": 0.9, "d": 0.5}) == ["a", "c", "d", "b"]
    assert _starts({"a": 0.0, "b": 0.5, "c": 0.2, "d": 0.5}) == ["a", "b", "d", "c"]


def test_a_queued_attempt_that_fits_starts_before_a_higher_priority_one_that_does_not() -> None:
    """Backfill: priority orders who gets freed room first, among attempts that fit."""
    sc = _quiet()
    big = replace(_one_task_workflow(1.0, 1.0), id="big")
    small = replace(_one_task_workflow(1.0, 1.0), id="small")
    first = replace(_one_task_workflow(1.0, 1.0, duration=50.0), id="first")

    class Sizes:
        name = "sizes"

        def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
            cpu = {"first": 0.5, "big": 0.9, "small": 0.4}
            prio = {"first": 0.0, "big": 1.0, "small": 0.0}
            return [Decision(t, 0, cpu[t.run.wf.id], 0.3, 1, prio[t.run.wf.id]) for t in ready]

    sim = Simulator(sc, [first, big, small], keep_log=True)
    sim.run(Sizes())
    assert sim.log is not None
    start = {r.wf_id: r.start_s for r in sim.log}
    # "small" fits beside "first" at once; "big" waits for the whole node, though it ranks first
    assert start["small"] == start["first"] < start["big"]


def test_policy_choosing_dead_node_is_an_error() -> None:
    sc = _quiet()
    sim = Simulator(sc, [_one_task_workflow(1.0, 1.0)])
    sim.cluster.set_alive(0, False)
    with pytest.raises(PolicyError, match="dead"):
        sim.run(Fixed(0.5, 0.5))


def test_policy_must_decide_every_ready_task() -> None:
    class Lazy:
        name = "lazy"

        def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
            return []

    sim = Simulator(_quiet(), [_one_task_workflow(1.0, 1.0)])
    with pytest.raises(PolicyError, match="no decision"):
        sim.run(Lazy())


def test_remote_parent_output_is_transferred_first() -> None:
    sc = _quiet()
    parent = TaskSpec("p", TaskType.CPU, 10.0, 1.0, 1.0, output_bytes=5e9)
    child = TaskSpec("c", TaskType.CPU, 10.0, 1.0, 1.0)
    wf = Workflow.build("wf", [parent, child], [(0, 1)], deadline_s=1e6)

    class Split:
        name = "split"

        def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
            return [Decision(t, t.idx * 3, 0.2, 0.3, 1) for t in ready]  # node 0, then node 3

    sim = Simulator(sc, [wf], keep_log=True)
    sim.run(Split())
    assert sim.log is not None
    p_row, c_row = sorted(sim.log, key=lambda r: r[1])
    xfer = sim.cluster.network.transfer_s(0, 3, 5e9)
    assert xfer > 0.4  # 5 GB over at most 10 Gbit/s
    assert c_row[5] == pytest.approx(p_row[6] + xfer)


def _first_attempts_failed(sc: ScenarioConfig, policy: str, keyed: bool) -> set[tuple[str, int]]:
    sim = Simulator(sc, generate_workflows(sc, 0), seed=5, keep_log=True, keyed_attempts=keyed)
    sim.run(make_policy(policy, 0))
    assert sim.log is not None
    return {(r.wf_id, r.idx) for r in sim.log if r.attempt == 0 and r.outcome == "transient"}


def test_keyed_attempt_draws_give_two_policies_the_same_transient_failures() -> None:
    # two policies start attempts in different orders: from one stream, which task a
    # transient failure lands on is reshuffled; drawn per task at arrival, a task fails under
    # both unless its draw falls between the two nodes' rates (each node's is 0.5-1.5x)
    sc = small_scenario(workflows=40, node_failure_per_hour=0.0, transient=0.2)

    def overlap(keyed: bool) -> float:
        a = _first_attempts_failed(sc, "heft", keyed)
        b = _first_attempts_failed(sc, "least_loaded", keyed)
        return len(a & b) / len(a | b)

    assert overlap(keyed=True) > 0.4
    assert overlap(keyed=False) < 0.25


def test_keyed_attempt_draws_change_nothing_else() -> None:
    # with no transient failures the keyed draws are never read: the same run to the byte
    sc = small_scenario(workflows=20, transient=0.0)
    a = Simulator(sc, generate_workflows(sc, 0), seed=2, keep_log=True)
    b = Simulator(sc, generate_workflows(sc, 0), seed=2, keep_log=True, keyed_attempts=True)
    a.run(make_policy("heft", 2))
    b.run(make_policy("heft", 2))
    assert json.dumps(a.log) == json.dumps(b.log)
