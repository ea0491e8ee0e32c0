"""Per-family history: decaying histograms, convergence to the truth, heft_history's rules."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.demand import recommended_request
from dagsched.core.estimates import raised_prediction_s
from dagsched.core.history import (
    HALF_LIFE_S,
    DecayingHistogram,
    FamilyStats,
    History,
    Measured,
    summarize,
)
from dagsched.sim.config import ScenarioConfig, TruthConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.reward import COMPLETION_SCALE_S, reward_terms
from dagsched.sim.runner import generate_workflows, make_policy, simulate
from tests.sim.conftest import small_scenario


def history_request(cores: float, mem: float, stats: FamilyStats | None) -> tuple[float, float]:
    """What heft_history reserves for a task of a family with these statistics."""
    return recommended_request(cores, mem, summarize(stats))


def test_histogram_percentiles_by_hand() -> None:
    h = DecayingHistogram()
    for x in (0.1, 0.2, 0.3, 0.4, 1.0):
        h.add(x, at_s=0.0)
    # buckets are 5% wide: a percentile is within one bucket above the sample
    assert 0.3 <= h.percentile(0.5) <= 0.3 * 1.05 + 1e-9
    assert 1.0 <= h.percentile(0.95) <= 1.05 + 1e-9
    assert DecayingHistogram().percentile(0.9) == 0.0


def test_older_samples_count_half_per_half_life() -> None:
    h = DecayingHistogram()
    for _ in range(3):
        h.add(1.0, at_s=0.0)  # three old samples ...
    h.add(2.0, at_s=2 * HALF_LIFE_S)  # ... weigh 3/4 against one new one
    assert h.percentile(0.5) > 2.0  # the new one outweighs them
    h.add(1.0, at_s=2 * HALF_LIFE_S)
    assert h.percentile(0.4) < 1.1


def test_runtime_prediction_is_the_mean_of_the_last_two() -> None:
    hist = History()
    assert hist.get("f") is None
    for r in (4.0, 1.0, 3.0):
        hist.finished("f", Measured(cpu=0.5, mem=0.5, runtime=r), at_s=0.0)
    stats = hist.get("f")
    assert stats is not None and stats.count == 3
    assert stats.runtime_ratio() == pytest.approx(2.0)


def test_raised_prediction_once_outlived() -> None:
    assert raised_prediction_s(100.0, 50.0, 300.0) == 100.0
    assert raised_prediction_s(100.0, 120.0, 300.0) == 300.0  # up to the declared estimate
    assert raised_prediction_s(100.0, 400.0, 300.0) == 800.0  # then twice the time elapsed


def test_vpa_request_by_hand() -> None:
    assert history_request(4.0, 10.0, None) == (4.0, 10.0)  # no history: the request
    hist = History()
    for _ in range(10):
        hist.finished("f", Measured(cpu=0.5, mem=0.5, runtime=1.0), at_s=0.0)
    cores, mem = history_request(4.0, 10.0, hist.get("f"))
    assert cores == pytest.approx(4.0 * 0.5 * 1.15, rel=0.06)  # p90 x request x 1.15
    assert mem == pytest.approx(10.0 * 0.5 * 1.15, rel=0.06)
    hist.oom("f", limit_ratio=0.8, at_s=1.0)
    _, bumped = history_request(4.0, 10.0, hist.get("f"))
    assert bumped == pytest.approx(10.0 * 0.8 * 1.2)  # x1.2 over the limit it was killed at


def test_history_converges_to_the_family_truth_on_a_long_run() -> None:
    """The simulator's history, fed only by measurements, finds each family's true p90
    memory peak ratio (one bucket = 5%) and median runtime ratio."""
    sc = small_scenario(workflows=500, nodes=16, load=0.5, node_failure_per_hour=0, transient=0)
    sim = Simulator(sc, generate_workflows(sc, 21), seed=21)
    sim.run(make_policy("heft_history", 21))
    checked = 0
    rng = np.random.default_rng(0)
    cfg = sc.truth
    for family, stats in sim.history.families.items():
        if stats.count < 150:
            continue
        _cpu, mem, rt = sim.truth.family(family)
        # the truth's own p90 of this family's memory ratio, by sampling its task spread
        draws = mem * np.exp(rng.normal(0, cfg.mem_peak_task_sigma, 20_000))
        assert stats.mem.percentile(0.9) == pytest.approx(np.quantile(draws, 0.9), rel=0.12)
        assert stats.runtime.percentile(0.5) == pytest.approx(rt, rel=0.15)
        checked += 1
    assert checked >= 3


def test_heft_history_beats_declared_heft_on_the_faithful_world() -> None:
    sc = ScenarioConfig()
    sc = replace(sc, workload=replace(sc.workload, workflows=80))
    hist = simulate(sc, "heft_history", seed=10_003)
    heft = simulate(sc, "heft", seed=10_003)
    assert hist["oom_kills"] < heft["oom_kills"] / 3
    assert hist["sla_attainment"] > heft["sla_attainment"]
    assert hist["cost_core_s"] < heft["cost_core_s"]


def test_completion_terms_sum_to_the_time_workflows_spent_in_the_system() -> None:
    sc = small_scenario(workflows=40, node_failure_per_hour=1.0, transient=0.4)
    wfs = generate_workflows(sc, 9)
    credits: list[float] = []
    sim = Simulator(
        sc,
        wfs,
        seed=9,
        keep_log=True,
        on_outcome=lambda t, o, r: credits.append(reward_terms(o)["completion"]),
    )
    last_decision = 0.0
    policy = make_policy("least_loaded", 9)
    while (batch := sim.advance()) is not None:
        sim.apply(policy.decide(sim, batch), batch)
        last_decision = sim.now
    assert sim.summary()["workflows_failed"] > 0  # the failure charge is exercised
    assert sim.log is not None
    # independently, from the attempt log: when each workflow ended and whether it failed
    ended: dict[str, float] = {}
    done: dict[str, int] = {}
    for r in sim.log:
        ended[r.wf_id] = max(ended.get(r.wf_id, 0.0), r.end_s)
        done[r.wf_id] = done.get(r.wf_id, 0) + (r.outcome == "done")
    expected = 0.0
    for wf in wfs:
        end = ended[wf.id]
        expected += max(0.0, min(end, last_decision) - wf.arrival_s)
        if done[wf.id] < wf.size and end <= last_decision:  # failed: charged to its deadline
            expected += max(0.0, wf.arrival_s + wf.deadline_s - end)
    assert -sum(credits) * COMPLETION_SCALE_S == pytest.approx(expected, rel=1e-9)


def test_exact_truth_teaches_history_the_declarations() -> None:
    """With no hidden truth, every family's history confirms its declaration: runtime ratio
    1, and p90 use and peak in the bucket holding 1, so heft_history reserves the request
    +15% (+ up to one 5% bucket): VPA's margin, which in an exact world is pure waste."""
    sc = replace(small_scenario(workflows=40), truth=TruthConfig(exact=True))
    sim = Simulator(sc, generate_workflows(sc, 3), seed=3)
    sim.run(make_policy("heft_history", 3))
    assert sim.history.families
    for stats in sim.history.families.values():
        if stats.count:
            assert stats.runtime_ratio() == pytest.approx(1.0)
            cores, mem = history_request(10.0, 10.0, stats)
            assert 11.5 - 1e-9 <= cores <= 11.5 * 1.05 + 1e-9
            assert 11.5 - 1e-9 <= mem <= 11.5 * 1.05 + 1e-9


def test_a_kept_summary_follows_every_outcome_and_a_replaced_family_table() -> None:
    """`History.summary` keeps a family's summary between outcomes, never past one."""
    h = History()
    assert h.summary("a") is None
    h.finished("a", Measured(cpu=0.5, mem=0.5, runtime=1.0), 0.0)
    first = h.summary("a")
    assert first is not None and first == summarize(h.get("a")) and first.count == 1
    h.finished("a", Measured(cpu=0.9, mem=2.0, runtime=3.0), 10.0)
    second = h.summary("a")
    assert second == summarize(h.get("a")) and second is not None and second.count == 2
    assert second.runtime_ratio == 2.0 and second.mem_p90 > first.mem_p90
    h.oom("a", 2.5, 20.0)
    assert (s := h.summary("a")) is not None and s.ooms == 1 and s.oom_limit == 2.5
    h.families = {"a": FamilyStats(count=7)}  # a run starting from a recorded history
    assert (s := h.summary("a")) is not None and s.count == 7
