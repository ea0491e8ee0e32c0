"""The replay judge's pure logic: the paired test, window cutting, the learned truth, and a
small calibrated replay (common random numbers, fidelity, the unreliable verdict)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.history import FamilyStats, History, Measured
from dagsched.core.workflow import TaskSpec, Workflow
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import (
    MEASURED,
    RECENT_OOM_RETRIES,
    UNRELIABLE,
    ObservedWindow,
    ReplayJudge,
    ReplayJudgeConfig,
    TrafficRecorder,
    censored_median,
    fidelity_of,
    paired_diffs,
    remainder,
)
from dagsched.learner.sequential import PairedRule, PairedTest
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.learned_truth import LearnedTruth
from dagsched.sim.replay_world import AsServed, ReplayResult
from dagsched.sim.runner import make_policy, stream_workflows


def _wf(i: int, family: str = "f") -> Workflow:
    return Workflow.build(f"w{i}", [TaskSpec("a", "cpu", 10.0, 1.0, 1.0, family=family)], [],
                          arrival_s=float(i))  # fmt: skip


def test_paired_test_promotes_a_real_gain_and_not_noise() -> None:
    rng = np.random.default_rng(0)
    rule = PairedRule(min_samples=8)
    gain, noise = PairedTest(rule), PairedTest(rule)
    for _ in range(40):
        gain.add({"jct": 0.08 + rng.normal(0, 0.03), "sla": 0.03, "reward": 0.0})
        noise.add({"jct": rng.normal(0, 0.03), "sla": rng.normal(0, 0.02), "reward": 0.0})
    assert gain.verdict().decision == "promote"
    assert noise.verdict().decision != "promote"


def test_paired_test_waits_for_min_samples_and_identical_never_promotes() -> None:
    t = PairedTest(PairedRule(min_samples=16))
    for _ in range(15):
        t.add({"jct": 0.5, "sla": 0.5, "reward": 0.5})
    assert t.verdict().decision == "continue"
    same = PairedTest(PairedRule(min_samples=4, max_samples=50))
    for _ in range(50):
        same.add({"jct": 0.0, "sla": 0.0, "reward": 0.0})
    v = same.verdict()
    assert v.decision == "retire" and "futile" in v.reason


def _windows_that_disagree(rule: PairedRule) -> PairedTest:
    # each window's 8 replays agree (the window's workflows favour one version), but the
    # windows disagree: +5%, 0%, +4%, +1%
    rng = np.random.default_rng(1)
    t = PairedTest(rule)
    for gain in (0.05, 0.0, 0.04, 0.01):
        t.add_window([{"jct": gain + rng.normal(0, 0.002), "sla": 0.0, "reward": 0.0}
                      for _ in range(8)])  # fmt: skip
    return t


def test_paired_test_by_default_judges_the_gain_on_the_traffic_seen() -> None:
    # on these four windows the challenger is a sure +2.5%: the replays are the noise
    v = _windows_that_disagree(PairedRule(min_samples=16)).verdict()
    assert v.decision == "promote" and v.stats["jct"].lower > 0


def test_paired_test_over_windows_counts_the_spread_between_them() -> None:
    # four windows this far apart say the gain on traffic like it may be nothing
    v = _windows_that_disagree(PairedRule(min_samples=16, variance="windows")).verdict()
    assert v.decision != "promote" and v.stats["jct"].lower < 0
    assert "between-window" in v.rule


def test_paired_test_does_not_promote_a_change_worth_nothing_in_any_window() -> None:
    # every window's replays centre on 0 with the spread a loaded replay has (6% a replay,
    # as an identical copy's do); a window's mean still lands up to ~4 points off 0
    rule = PairedRule(min_samples=16)
    promoted = 0
    for seed in range(40):
        rng = np.random.default_rng(100 + seed)
        t = PairedTest(rule)
        for _ in range(10):
            t.add_window([{"jct": rng.normal(0, 0.06), "sla": rng.normal(0, 0.03),
                           "reward": rng.normal(0, 0.01)} for _ in range(8)])  # fmt: skip
            if t.verdict().decision == "promote":
                promoted += 1
                break
    assert promoted <= 2  # alpha 0.05 over 40 runs of 10 looks each


def test_paired_test_waits_for_min_windows() -> None:
    t = PairedTest(PairedRule(min_samples=4, min_windows=2))
    t.add_window([{"jct": 0.3, "sla": 0.1, "reward": 0.1}] * 16)
    v = t.verdict()
    assert v.decision == "continue" and "windows" in v.reason
    t.add_window([{"jct": 0.3, "sla": 0.1, "reward": 0.1}] * 16)
    assert t.verdict().decision == "promote"


def test_paired_test_waits_for_min_windows_futile_before_calling_futility() -> None:
    # a sure +0.5%, short of the 2% minimum effect: futile once enough windows are in
    rule = PairedRule(min_samples=4, min_windows=2, min_windows_futile=4)
    rng = np.random.default_rng(2)
    t = PairedTest(rule)
    decisions = []
    for _ in range(4):
        t.add_window([{"jct": 0.005 + rng.normal(0, 0.001), "sla": 0.0, "reward": 0.0}
                      for _ in range(8)])  # fmt: skip
        decisions.append(t.verdict())
    assert [v.decision for v in decisions[:3]] == ["continue"] * 3
    assert decisions[1].stats["jct"].upper < rule.min_effect["jct"]  # futile by then, held
    assert decisions[3].decision == "retire" and "futile" in decisions[3].reason


def test_paired_test_retires_a_worse_challenger_before_min_windows_futile() -> None:
    rule = PairedRule(min_samples=4, min_windows=2, min_windows_futile=4)
    t = PairedTest(rule)
    for _ in range(2):
        t.add_window([{"jct": -0.2, "sla": -0.1, "reward": -0.05}] * 8)
    v = t.verdict()
    assert v.decision == "retire" and "worse" in v.reason


def test_paired_diffs_are_higher_better() -> None:
    a = ReplayResult({"x": 100.0}, {"x": False}, [0.1])
    b = ReplayResult({"x": 80.0}, {"x": True}, [0.3])
    d = paired_diffs(a, b)
    assert d["jct"] == 0.2 and d["sla"] == 1.0 and abs(d["reward"] - 0.2) < 1e-12


def test_recorder_cuts_non_overlapping_windows_with_warmup() -> None:
    r = TrafficRecorder(window_workflows=3, warmup_workflows=4)
    for i in range(7):
        r.workflow(_wf(i))
        r.snapshot({})
    assert not r.ready({})  # nothing has ended
    for i in range(6):
        r.ended(f"w{i}", 5.0, True)
    got = r.ready({})
    assert [w.index for w in got] == [0, 1]
    assert [x.id for x in got[0].workflows] == ["w0", "w1", "w2"] and not got[0].warmup
    assert [x.id for x in got[1].warmup] == ["w0", "w1", "w2"]
    for i in range(7, 15):
        r.workflow(_wf(i))
    # window 2 (w6-w8) never ended, but windows 3 and 4 filled after it: closed without them
    (late,) = r.ready({})
    assert (
        late.index == 2
        and late.jct_s == {}
        and [x.id for x in late.warmup] == ["w2", "w3", "w4", "w5"]
    )


def test_a_window_replays_only_the_latest_warm_up_arrivals_it_is_asked_for() -> None:
    """What a search replays: the window after a shorter warm-up, its history unchanged."""
    r = TrafficRecorder(window_workflows=2, warmup_workflows=4)
    for i in range(8):
        r.workflow(_wf(i))
        r.snapshot({})
    for i in range(8):
        r.ended(f"w{i}", 1.0, True)
    last = r.ready({})[-1]
    sc = load_settings(profile="test").sim
    assert [x.id for x in last.world(sc).workflows] == [f"w{i}" for i in range(2, 8)]
    assert [x.id for x in last.world(sc, 1).workflows] == ["w5", "w6", "w7"]
    assert [x.id for x in last.world(sc, 0).workflows] == ["w6", "w7"]
    assert [x.id for x in last.world(sc, 9).workflows] == [f"w{i}" for i in range(2, 8)]


def test_a_window_keeps_the_later_arrivals_that_came_while_it_ran() -> None:
    """What the window's stragglers competed with: arrivals after it up to its last end."""
    r = TrafficRecorder(window_workflows=2, warmup_workflows=0)
    for i in range(6):
        r.workflow(_wf(i))  # w_i arrives at i s
    r.ended("w0", 2.0, True)  # ends at 2
    r.ended("w1", 2.5, True)  # ends at 3.5: w2 and w3 arrived while it ran, w4 after
    (first,) = r.ready({})
    assert [x.id for x in first.after] == ["w2", "w3"]
    assert [x.id for x in first.world(load_settings(profile="test").sim).workflows] == [
        "w0", "w1", "w2", "w3"
    ]  # fmt: skip
    assert first.world(load_settings(profile="test").sim).counted == {"w0", "w1"}
    for i in range(6, 8):
        r.workflow(_wf(i))
    # window 1 (w2, w3) never ended; closed once two later windows filled: every later
    # arrival known then is kept (its stragglers were still running)
    (late,) = r.ready({})
    assert [x.id for x in late.after] == ["w4", "w5", "w6", "w7"]
    capped = TrafficRecorder(window_workflows=2, warmup_workflows=0, after_workflows=1)
    for i in range(4):
        capped.workflow(_wf(i))
    capped.ended("w0", 2.0, True)
    capped.ended("w1", 2.5, True)
    assert [x.id for x in capped.ready({})[0].after] == ["w2"]


def _chain(i: int, n: int) -> Workflow:
    tasks = [TaskSpec(f"t{k}", "cpu", 10.0, 1.0, 1.0, family="f") for k in range(n)]
    edges = [(k, k + 1) for k in range(n - 1)]
    return Workflow.build(f"w{i}", tasks, edges, arrival_s=float(i), deadline_s=100.0)


def test_remainder_keeps_the_unfinished_tasks_and_the_due_time() -> None:
    wf = _chain(0, 3)
    cut = remainder(wf, {0}, 40.0)
    assert cut is not None and cut.id == "w0" and cut.size == 2
    assert cut.arrival_s == 40.0 and cut.deadline_s == 60.0  # due at 100 s, as before
    assert [t.name for t in cut.tasks] == ["t1", "t2"] and cut.parents[1] == [0]
    assert remainder(wf, {0, 1, 2}, 40.0) is None


def test_windows_carry_the_work_in_flight_when_their_warm_up_began() -> None:
    """With `carry_in_flight`, a window's replay starts on a cluster that holds what it held:
    the workflows still running when its first warm-up workflow arrived, cut to their tasks
    not finished then. A workflow whose end was never reported is let go after a while."""
    r = TrafficRecorder(window_workflows=2, warmup_workflows=2, carry_in_flight=True)
    off = TrafficRecorder(window_workflows=2, warmup_workflows=2)
    for rec in (r, off):
        rec.workflow(_chain(0, 2))
        rec.workflow(_chain(1, 3))
        rec.ended("w0", 1.0, True)
        rec.task_finished("w1", 0)
        for i in range(2, 6):  # window 2 (w4, w5) warms up on w2, w3: w1 was in flight
            rec.workflow(_chain(i, 1))
        for i in range(1, 6):
            rec.ended(f"w{i}", 1.0, True)
    got = {w.index: w for w in r.ready({})}
    (carried,) = got[2].carried
    assert carried.id == "w1" and carried.size == 2 and carried.arrival_s == 2.0
    world = got[2].world(load_settings(profile="test").sim)
    assert [w.id for w in world.workflows] == ["w1", "w2", "w3", "w4", "w5"]
    assert world.counted == {"w4", "w5"}
    assert not got[1].carried  # w0 ended before w1 (its warm-up start) arrived
    assert all(not w.carried for w in off.ready({}))
    # one never reported ended: carried for two windows' worth of arrivals, then let go
    lost = TrafficRecorder(window_workflows=2, warmup_workflows=2, carry_in_flight=True)
    lost.workflow(_chain(0, 2))
    for i in range(1, 12):
        lost.workflow(_chain(i, 1))
        lost.ended(f"w{i}", 0.5, True)
    held = {w.index: [c.id for c in w.carried] for w in lost.ready({})}
    assert held[2] == held[3] == ["w0"] and held[4] == held[5] == []


def test_later_arrivals_load_the_replay_of_a_window() -> None:
    """Replayed without the traffic that came after it, a window's last workflows run on a
    cluster emptying for want of later arrivals, and finish sooner than they did."""
    wins, sc = _recorded(60, 10)
    obs = next(w for w in wins if w.after)
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=10, replays=2)
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    judge = ReplayJudge(cfg, sc)
    loaded = judge.replay(obs.world(sc), heft, obs.index)
    alone = judge.replay(replace(obs, after=[]).world(sc), heft, obs.index)
    assert all(set(r.jct_s) == set(obs.jct_s) for r in [*loaded, *alone])
    assert np.mean([r.mean_jct_s for r in loaded]) > np.mean([r.mean_jct_s for r in alone])


def test_the_restart_cost_after_an_oom_kill_follows_a_change_within_a_few_retries() -> None:
    """The shifted world's hour-long restart starts mid-run: the estimate the replays use
    reflects the latest retries, not the run's average."""
    r = TrafficRecorder(window_workflows=10, warmup_workflows=0)
    for k in range(200):
        r.attempt_ended(float(k), False, overhead_s=1.0)
    for k in range(40):
        r.attempt_ended(200.0 + k, False, overhead_s=1.0, after_oom=True)
    assert r.oom_restart_s == 0.0  # before: a retry costs what any attempt does
    for k in range(RECENT_OOM_RETRIES // 2 + 1):  # started at 300 + k
        r.attempt_ended(3901.0 + k, False, overhead_s=3601.0, after_oom=True)
    # most of the latest retries restart for an hour: the mean of the latest would say half
    assert r.oom_restart_s == 3600.0
    for k in range(RECENT_OOM_RETRIES):
        r.attempt_ended(3951.0 + k, False, overhead_s=3601.0, after_oom=True)
    assert r.oom_restart_s == 3600.0  # the run's average would say a third of it
    r.attempt_ended(4000.0, True, "oom", overhead_s=0.0, after_oom=True)  # a failed retry
    assert r.oom_restart_s == 3600.0


def test_retries_still_running_show_a_longer_restart_before_they_end() -> None:
    """An hour-long restart shows while its first retries still run: each, once it has
    outlived twice its expected run time, counts at the time beyond (a lower bound), and
    its end replaces that by what it cost."""
    r = TrafficRecorder(window_workflows=10, warmup_workflows=0)
    for k in range(200):
        r.attempt_ended(float(k), False, overhead_s=1.0)
    for k in range(10):  # the old cost: no restart
        r.attempt_ended(205.0 + k, False, overhead_s=1.0, after_oom=True, started_s=200.0 + k)
    for k in range(11):  # retries expected to run 100 s start at 300 + k, then restart
        r.retry_started(("t", k), 300.0 + k, 100.0)
    r.clock(450.0)  # nothing outlived 200 s yet
    assert r.oom_restart_s == 0.0
    r.clock(1510.0)  # the 11 have run 1,200 s and more: 1,000 s or more beyond 200 s
    # the latest 20 by start: 9 old and the 11 running, 1,000 to 1,010 s beyond
    assert r.oom_restart_s == 1000.5
    assert 209.0 < r.oom_restart_from_s < 300.0
    for k in range(11):
        r.attempt_ended(3990.0 + k, False, overhead_s=3601.0, after_oom=True,
                        started_s=300.0 + k, key=("t", k))  # fmt: skip
    assert r.oom_restart_s == 3600.0
    r.clock(20_000.0)  # ended retries are no longer running
    assert r.oom_restart_s == 3600.0


def test_retries_still_running_do_not_pull_the_restart_below_what_ended_ones_cost() -> None:
    """A burst of fresh OOM kills: their retries still run, each known to cost at least
    what it has outlived so far. Taken as values they would drag the median below the
    hour the ended retries show; as lower bounds they leave it there."""
    r = TrafficRecorder(window_workflows=10, warmup_workflows=0)
    for k in range(200):
        r.attempt_ended(float(k), False, overhead_s=1.0)
    for k in range(10):  # ended: an hour's restart each
        start = 100.0 + k
        r.attempt_ended(start + 3601, False, overhead_s=3601.0, after_oom=True, started_s=start)
    for k in range(10):  # started later, expected to run 100 s: 1,000 to 1,900 s beyond 200 s
        r.retry_started(("t", k), 5000.0 + 100.0 * k, 100.0)
    r.clock(7100.0)
    # taken as values: the median of 10 at 3,600 s and 10 at 1,000 to 1,900 s would be 2,750
    assert r.oom_restart_s == 3600.0
    assert r.oom_restart_from_s == 0.0  # every kept retry that shows a cost shows the hour


def test_censored_median() -> None:
    assert censored_median([(1.0, True), (3.0, True), (2.0, True), (4.0, True)]) == 2.5
    # the bounds below the ended values leave the risk set: the median is what ended
    assert censored_median([(5.0, True), (5.0, True), (1.0, False), (2.0, False)]) == 5.0
    # an end at 1 before bounds at 2 and 3: half have ended by 1 on the Kaplan-Meier curve
    assert censored_median([(1.0, True), (2.0, False), (3.0, True), (9.0, True)]) == 3.0
    # too few ended to reach half: the values as they are, a lower bound
    assert censored_median([(1.0, True), (4.0, False), (6.0, False)]) == 4.0
    with pytest.raises(ValueError):
        censored_median([])


def test_the_restart_cost_is_charged_from_when_it_began_to_hold() -> None:
    """Retries started before the hour-long restart began did not pay it: the replay's
    shift starts between the last retry without it and the first with it."""
    r = TrafficRecorder(window_workflows=10, warmup_workflows=0)
    for k in range(200):
        r.attempt_ended(float(k), False, overhead_s=1.0)
    for k in range(30):
        r.attempt_ended(20.0 * k + 5, False, overhead_s=1.0, after_oom=True, started_s=20.0 * k)
    assert r.oom_restart_s == 0.0 and r.oom_restart_from_s == 0.0
    # one retry late in the old regime is slow for its own reasons: noise, not the change
    r.attempt_ended(600.0 + 3601, False, overhead_s=3601.0, after_oom=True, started_s=600.0)
    r.attempt_ended(700.0 + 5, False, overhead_s=1.0, after_oom=True, started_s=700.0)
    for k in range(RECENT_OOM_RETRIES):
        start = 1000.0 + 50.0 * k
        r.attempt_ended(start + 3601, False, overhead_s=3601.0, after_oom=True, started_s=start)
    assert r.oom_restart_s == 3600.0
    assert r.oom_restart_from_s == (700.0 + 1000.0) / 2
    obs = ObservedWindow(0, [_wf(0)], [], {}, {}, [], {}, {}, oom_restart_s=r.oom_restart_s,
                         oom_restart_from_s=r.oom_restart_from_s)  # fmt: skip
    shift = obs.world(ScenarioConfig()).scenario.shift
    assert shift is not None and shift.at_s == 850.0 and shift.oom_restart_s == 3600.0


def test_learned_truth_draws_from_history_with_common_random_numbers() -> None:
    h = History()
    for k in range(200):
        h.finished("f", Measured(0.5, 2.0, 1.5), float(k))
    truth = LearnedTruth(h.families)
    wf = Workflow.build("w", [TaskSpec(str(i), "cpu", 10.0, 1.0, 1.0, family="f")
                              for i in range(50)], [])  # fmt: skip
    a = truth.draw(wf, np.random.default_rng(3))
    b = truth.draw(wf, np.random.default_rng(3))
    assert np.array_equal(a, b)
    assert np.all(np.abs(a / np.array([0.5, 2.0, 1.5]) - 1) < 0.06)  # within one 5% bucket
    unknown = Workflow.build("u", [TaskSpec("a", "cpu", 10.0, 1.0, 1.0, family="new")], [])
    assert abs(truth.draw(unknown, np.random.default_rng(0))[0, 1] / 2.0 - 1) < 0.06  # pooled
    nothing = LearnedTruth({"g": FamilyStats()})
    assert np.array_equal(nothing.draw(unknown, np.random.default_rng(0)), np.ones((1, 3)))


def _recorded(n: int, warmup: int) -> tuple[list, object]:
    sc = load_settings(profile="test").sim
    rec = TrafficRecorder(20, warmup)
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history", 4), rec, stream_workflows(sc, 4, n),
    )  # fmt: skip
    return wins, sc


def test_identical_versions_replay_identically_and_a_worse_one_is_retired() -> None:
    wins, sc = _recorded(60, 10)
    assert len(wins) == 3
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=10, replays=4,
                            fidelity_max_jct_err=10.0, rule=PairedRule(min_samples=8))  # fmt: skip
    same = ReplayJudge(cfg, sc)
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    for w in wins:
        rep = same.judge(w, heft, heft)
        assert all(d == {"jct": 0.0, "sla": 0.0, "reward": 0.0} for d in rep.diffs)
    assert same.reports[-1].decision != "promote"
    worse = ReplayJudge(cfg, sc)
    for w in wins:
        rep = worse.judge(w, heft, lambda s: make_policy("random", s))
    assert rep.decision == "retire" and rep.verdict is not None
    assert rep.verdict.stats["jct"].upper < 0


def test_poor_fidelity_is_refused() -> None:
    wins, sc = _recorded(20, 0)
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=0, replays=2,
                            fidelity_max_jct_err=1e-6)  # fmt: skip
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    rep = ReplayJudge(cfg, sc).judge(wins[0], heft, heft)
    assert rep.decision == UNRELIABLE and "fidelity" in rep.reason and not rep.diffs
    assert rep.fidelity.jct_err > 0


def test_a_window_measured_for_fidelity_only_is_refused_as_any_other() -> None:
    wins, sc = _recorded(20, 0)
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=0, replays=2)
    ok = ReplayJudge(replace(cfg, fidelity_max_jct_err=10.0), sc).measure(wins[0], heft)
    assert ok.decision == MEASURED and not ok.diffs and len(ok.champion) == 2
    bad = ReplayJudge(replace(cfg, fidelity_max_jct_err=1e-6), sc).measure(wins[0], heft)
    assert bad.decision == UNRELIABLE and "fidelity" in bad.reason
    with pytest.raises(ValueError, match="shared"):  # replayed as served, not alone
        ReplayJudge(cfg, sc).measure(replace(wins[0], elsewhere=frozenset(wins[0].jct_s)), heft)


def test_a_window_with_no_observed_end_is_refused_and_reported_as_valid_json() -> None:
    wins, sc = _recorded(20, 0)
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=0, replays=2,
                            fidelity_max_jct_err=10.0)  # fmt: skip
    # no workflow of it seen to end, and no time known to cut the others at
    unseen = replace(wins[0], jct_s={}, met={}, closed_s=None)
    rep = ReplayJudge(cfg, sc).judge(unseen, heft, heft)
    assert rep.decision == UNRELIABLE and "no workflow" in rep.reason and not rep.diffs
    assert rep.fidelity.jct_err is None and rep.fidelity.compared == 0
    assert json.loads(json.dumps(rep.to_dict(), allow_nan=False))["fidelity"]["jct_err"] is None
    seen = ReplayJudge(cfg, sc).judge(wins[0], heft, heft).fidelity
    assert seen.compared == len(wins[0].jct_s) and seen.jct_err is not None


def test_a_window_closed_before_its_workflows_ended_is_compared_on_jct_cut_at_the_close() -> None:
    wins, _ = _recorded(20, 0)
    obs = wins[0]
    wfs = obs.workflows
    rng = np.random.default_rng(0)
    true = {w.id: float(j) for w, j in zip(wfs, rng.uniform(500, 1500, len(wfs)), strict=True)}
    # replays as faithful as they come: every workflow's JCT drawn as the truth was, not
    # the truth itself (a replay cannot know which workflows were lucky)
    replays = [
        ReplayResult(jct_s={w.id: float(rng.uniform(500, 1500)) for w in wfs},
                     met={w.id: True for w in wfs})
        for _ in range(64)
    ]  # fmt: skip
    full = replace(obs, jct_s=true, met={i: True for i in true}, elsewhere=frozenset())
    assert full.cuts() is None
    assert fidelity_of([(full, replays)]).jct_err < 0.15
    # closed when only the fast half had ended
    closed_s = float(np.median([w.arrival_s + true[w.id] for w in wfs]))
    ended = {w.id: true[w.id] for w in wfs if w.arrival_s + true[w.id] <= closed_s}
    early = replace(full, jct_s=ended, met={i: True for i in ended}, closed_s=closed_s)
    f = fidelity_of([(early, replays)])
    assert f.censored == len(wfs) - len(ended) > 0 and f.compared == len(wfs)
    assert f.jct_err is not None and f.jct_err < 0.15
    # what comparing the ended ones alone would say: the replay far too slow
    alone = replace(early, closed_s=None)
    assert fidelity_of([(alone, replays)]).jct_err > 0.25


def test_fidelity_counts_only_what_the_serving_version_served() -> None:
    wins, _ = _recorded(20, 0)
    obs = wins[0]
    ids = sorted(obs.jct_s)
    # a replay that matches what was served exactly, except on the other version's workflows
    other = set(ids[: len(ids) // 2])
    replay = ReplayResult(
        jct_s={i: obs.jct_s[i] * (3.0 if i in other else 1.0) for i in ids},
        met={i: obs.met[i] for i in ids},
    )
    assert fidelity_of([(obs, [replay])]).jct_err > 0.5
    served_elsewhere = replace(obs, elsewhere=frozenset(other))
    assert fidelity_of([(served_elsewhere, [replay])]).jct_err == 0.0


def test_the_recorder_keeps_which_warmup_workflows_another_version_served() -> None:
    r = TrafficRecorder(window_workflows=2, warmup_workflows=2)
    for i in range(4):
        r.workflow(_wf(i))
        r.snapshot({})
    for i in range(4):
        r.ended(f"w{i}", 5.0, True, served=i != 1)  # w1: the challenger's slice
    first, second = r.ready({})
    assert first.elsewhere == {"w1"}
    assert [x.id for x in second.warmup] == ["w0", "w1"] and second.elsewhere == {"w1"}


def test_the_recorder_keeps_the_version_that_served_each_workflow() -> None:
    r = TrafficRecorder(window_workflows=2, warmup_workflows=2)
    for i in range(4):
        r.workflow(_wf(i))
        r.snapshot({})
    for i, v in enumerate(["v1", "v1", "v2", None]):  # w3: the fallback heuristic served it
        r.ended(f"w{i}", 5.0, True, version=v)
    first, second = r.ready({})
    assert [x.id for x in first.after] == ["w2", "w3"]  # they came while it ran
    assert first.served_by == {"w0": "v1", "w1": "v1", "w2": "v2"}
    assert second.served_by == {"w0": "v1", "w1": "v1", "w2": "v2"}  # its warm-up's too


class _Seen:
    """A policy that remembers the workflows it decided for."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inner = make_policy("heft_history", 0)
        self.ids: set[str] = set()

    def decide(self, sim, ready):  # type: ignore[no-untyped-def]
        self.ids |= {t.run.wf.id for t in ready}
        return self.inner.decide(sim, ready)


def test_as_served_gives_each_policy_the_workflows_it_served() -> None:
    sc = load_settings(profile="test").sim
    wfs = list(stream_workflows(sc, 4, 20))
    others = frozenset(w.id for w in wfs[::3])
    main, other = _Seen("a"), _Seen("b")
    Simulator(sc, wfs, seed=4).run(AsServed(main, dict.fromkeys(others, other)))
    assert other.ids == others and main.ids == {w.id for w in wfs} - others


def test_fidelity_replays_the_challenger_on_the_slice_it_served() -> None:
    wins, sc = _recorded(40, 10)
    obs = wins[1]
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=10, replays=2,
                            fidelity_max_jct_err=10.0)  # fmt: skip
    heft = lambda s: make_policy("heft_history", s)  # noqa: E731
    slow = lambda s: make_policy("random", s)  # noqa: E731
    alone = ReplayJudge(cfg, sc).judge(obs, heft, slow).fidelity
    # served by heft_history alone: the challenger's replays play no part in fidelity
    assert ReplayJudge(cfg, sc).judge(obs, heft, heft).fidelity == alone
    # a slice the challenger served (in the window and its warm-up) is replayed under it
    sliced = replace(obs, elsewhere=frozenset(w.id for w in [*obs.warmup, *obs.workflows][::2]))
    judge = ReplayJudge(cfg, sc)
    shared = judge.judge(sliced, heft, slow).fidelity
    champion_alone = judge.replay(sliced.world(sc), heft, sliced.index)
    assert shared.observed_jct_s == fidelity_of([(sliced, champion_alone)]).observed_jct_s
    assert shared.predicted_jct_s > fidelity_of([(sliced, champion_alone)]).predicted_jct_s


def test_a_shared_window_is_replayed_as_served_only_fidelity_replays_times() -> None:
    wins, sc = _recorded(40, 10)
    obs = replace(wins[1], elsewhere=frozenset(w.id for w in wins[1].workflows[::2]))
    cfg = ReplayJudgeConfig(window_workflows=20, warmup_workflows=10, replays=4,
                            fidelity_max_jct_err=10.0, fidelity_replays=1)  # fmt: skip
    made: list[int] = []

    def challenger(seed: int):  # type: ignore[no-untyped-def]
        made.append(seed)
        return make_policy("heft_history", seed)

    rep = ReplayJudge(cfg, sc).judge(obs, lambda s: make_policy("heft_history", s), challenger)
    # one as-served replay (its challenger part) and K challenger replays, all judged
    assert len(made) == 1 + cfg.replays and made[0] == made[1]
    assert len(rep.diffs) == cfg.replays and len(rep.champion) == cfg.replays
