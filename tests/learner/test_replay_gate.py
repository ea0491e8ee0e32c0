"""The replay judge fed from the wire: the per-family history it learns from end events, and
the gate's bookkeeping of windows, pairs and a win waiting for the canary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest

from dagsched.core.bounds import CPU_BOUNDS
from dagsched.core.heft import HeftHistory
from dagsched.core.history import History, measured_ratios
from dagsched.core.scheduler import Placement, Scheduler
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import Workflow
from dagsched.learner.live_ab import Sample
from dagsched.learner.replay_feed import MessageFeed, record_run
from dagsched.learner.replay_gate import Job, ReplayGate
from dagsched.learner.replay_judge import MEASURED, UNRELIABLE, ReplayJudge, TrafficRecorder
from dagsched.schemas.messages import (
    NodeHeartbeatMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskSpecMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.settings import load_settings
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import SchedulerPolicy

SPEED = {"cpu": {"cpu": 1.5, "io": 0.8, "gpu": 0.25, "mem": 1.0}}


def _workflow() -> WorkflowMsg:
    return WorkflowMsg(
        workflow_id="w1",
        arrival_s=0.0,
        deadline_s=600.0,
        tasks=[
            TaskSpecMsg(
                name="a", type="cpu", duration_s=30.0, cpu_cores=2.0, mem_gb=4.0, family="fa"
            ),
            TaskSpecMsg(
                name="b", type="cpu", duration_s=10.0, cpu_cores=1.0, mem_gb=8.0, family="fb"
            ),
        ],
        edges=[],
    )


def test_the_feed_learns_the_history_from_end_events_at_the_nodes_speed() -> None:
    feed = MessageFeed(TrafficRecorder(10, 0), speed=SPEED)
    feed.add(_workflow())
    feed.add(NodeHeartbeatMsg(node="n1", at=0.0, kind="cpu", zone=0, cores=32, mem_gb=128))
    common = {"workflow_id": "w1", "attempt": 0, "node": "n1"}
    feed.add(TaskFinishedMsg(task=0, at=40.0, cpu_core_s=24.0, peak_mem_gb=3.0, runtime_s=24.0,
                             **common))  # fmt: skip
    feed.add(TaskFailedMsg(task=1, at=50.0, reason="oom", peak_mem_gb=6.0, **common))
    feed.add(TaskFailedMsg(task=1, at=55.0, reason="transient", peak_mem_gb=1.0,
                           **{**common, "attempt": 1}))  # fmt: skip
    want = History()
    # 24 s of compute at the cpu node's 1.5 x speed for a 30 s declared task: ratio 1.2
    want.finished("fa", measured_ratios(30.0, 2.0, 4.0, 1.5, 24.0, 24.0, 3.0), 40.0)
    want.oom("fb", 6.0 / 8.0, 50.0)
    got = feed.families()
    assert got.keys() == want.families.keys()
    assert got["fa"].runtime_ratio() == pytest.approx(1.2)
    assert got["fa"].cpu.percentile(0.5) == want.families["fa"].cpu.percentile(0.5)
    assert got["fb"].ooms == 1 and got["fb"].oom_limit == 0.75 and got["fb"].count == 0
    got["fa"].count = 99  # a copy: the feed's own history is untouched
    assert feed.history.families["fa"].count == 1


def test_the_feed_shows_a_retry_after_an_oom_kill_that_outlives_its_expected_run() -> None:
    """Its start event, its declaration and its node's speed say when it should have ended;
    once it has outlived that twice over, the restart estimate knows it costs more."""
    rec = TrafficRecorder(10, 0)
    feed = MessageFeed(rec, speed=SPEED)
    feed.add(_workflow())
    feed.add(NodeHeartbeatMsg(node="n1", at=0.0, kind="cpu", zone=0, cores=32, mem_gb=128))
    common = {"workflow_id": "w1", "task": 1, "node": "n1"}
    feed.add(TaskStartedMsg(attempt=0, at=0.0, **common))
    feed.add(TaskFailedMsg(attempt=0, at=5.0, reason="oom", peak_mem_gb=9.0, **common))
    feed.add(TaskStartedMsg(attempt=1, at=10.0, **common))  # expected: 10 s / 1.5
    feed.add(TaskStartedMsg(workflow_id="w1", task=0, attempt=0, node="n1", at=10.0))
    feed.add(TaskFinishedMsg(workflow_id="w1", task=0, attempt=0, node="n1", at=40.0,
                             cpu_core_s=20.0, peak_mem_gb=3.0, runtime_s=20.0))  # fmt: skip
    # any attempt spends 10 s on the node beyond its compute; at 40 s the retry has outlived
    # twice its expected run time by 30 - 2 x 10 / 1.5
    assert rec.oom_restart_s == pytest.approx(30.0 - 20.0 / 1.5)
    feed.add(NodeHeartbeatMsg(node="n1", at=1_010.0, kind="cpu", zone=0, cores=32, mem_gb=128))
    # the retry has run 1,000 s: 1000 - 2 x 10 / 1.5 beyond twice its expected run time
    assert rec.oom_restart_s == pytest.approx(1_000.0 - 20.0 / 1.5)
    feed.add(TaskFinishedMsg(attempt=1, at=1_100.0, cpu_core_s=6.0, peak_mem_gb=3.0,
                             runtime_s=6.0, **common))  # fmt: skip
    assert rec.oom_restart_s == pytest.approx(1_084.0 - 10.0)  # what it cost, once it ended


class _Throttled(HeftHistory):
    """heft_history reserving the least CPU there is: every task runs throttled."""

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        return [replace(p, cpu=CPU_BOUNDS[0]) for p in super().place(cluster, tasks)]


def _gate(loaded: list[str]) -> ReplayGate[MessageFeed]:
    s = load_settings(profile="test")
    replay = s.evaluator.replay.model_copy(update={
        "window_workflows": 20, "warmup_workflows": 10, "replays": 2, "min_replays": 2,
        "fidelity_max_jct_err": 10.0,
    })  # fmt: skip
    s = s.model_copy(update={"evaluator": s.evaluator.model_copy(update={"replay": replay})})

    def load(version: str) -> Scheduler:
        loaded.append(version)
        return HeftHistory("srpt") if version == "1" else _Throttled()

    return ReplayGate.on_wire(s, load)


def _windows(gate: ReplayGate[MessageFeed], n: int) -> None:
    """Traffic of `n` workflows recorded into the gate's recorder, its windows waiting."""
    sc = gate.base
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history_srpt", 4), gate.recorder, stream_workflows(sc, 4, n),
    )  # fmt: skip
    gate.recent.extend(wins)  # as `next_window` keeps closed windows
    if gate.pair is not None:
        gate.waiting.extend(wins)
    elif gate.champion is not None:
        gate.unjudged.extend((w, Job(gate.champion, None, judged=False)) for w in wins)


def test_windows_are_judged_for_the_pair_under_test_only() -> None:
    loaded: list[str] = []
    gate = _gate(loaded)
    _windows(gate, 40)
    assert gate.next_window() is None  # no challenger: nothing to judge
    gate.versions("v1", "v2")
    # nor traffic that arrived before the pair: the champion served it, it is only measured
    while (early := gate.next_window()) is not None:
        assert not early[1].judged
        gate.unjudged.clear()
    _windows(gate, 40)
    nxt = gate.next_window()
    assert nxt is not None
    obs, pair, judge = nxt
    report = gate.judge_window(obs, pair, judge)
    assert sorted(loaded) == ["1", "2"] and len(report.diffs) == 2
    gate.versions("v1", "v3")  # the pair changed while the window was judged
    assert gate.take(report, pair) is None and not gate.reports
    assert gate.judge is not judge  # the new pair's test starts afresh


def test_a_replay_win_waits_in_won_and_a_retire_is_acted_on() -> None:
    gate = _gate([])
    gate.versions("v2", "v1")  # heft_history (v1) challenges its throttled copy (v2)
    _windows(gate, 60)
    decisions = []
    while (nxt := gate.next_window()) is not None:
        report = gate.judge_window(*nxt)
        decisions.append((report.decision, gate.take(report, nxt[1])))
    assert [a for _, a in decisions] == [None] * len(decisions)
    assert ("promote", None) in decisions and gate.won is not None
    gate.versions("v1", "v2")  # the other way round: the throttled one challenges, and loses
    gate.waiting.clear()
    _windows(gate, 60)
    acted = []
    while (nxt := gate.next_window()) is not None:
        report = gate.judge_window(*nxt)
        acted.append(gate.take(report, nxt[1]))
    assert "retire" in acted and gate.won is None


def test_a_finished_workflow_is_recorded_with_its_jct_and_who_served_it() -> None:
    gate = _gate([])
    a, b, c, d = stream_workflows(gate.base, 4, 4)
    gate.ended(Sample(a.id, "champion", "v1", 1.0, -0.5, 0.3, None, 123.0))
    assert gate.recorder.jct_s == {}  # not arrived: no window will hold it
    for wf in (a, b, c, d):
        gate.recorder.workflow(wf)
    gate.ended(Sample(a.id, "champion", "v1", 1.0, -0.5, 0.3, None, 123.0))
    gate.ended(Sample(b.id, "challenger", "v2", 0.0, -0.5, 0.3, None, 456.0))
    gate.ended(Sample(c.id, "fallback", "heft_history", 1.0, -0.5, 0.3, None, 78.0))
    gate.ended(Sample(d.id, "explore", "v3", 1.0, -0.5, 0.3, None, 90.0))
    assert gate.recorder.jct_s == {a.id: 123.0, b.id: 456.0, c.id: 78.0, d.id: 90.0}
    assert gate.recorder.met == {a.id: True, b.id: False, c.id: True, d.id: True}
    # the challenger's and the exploration slice's are not in fidelity; the fallback heuristic
    # served in the serving version's stead
    assert gate.recorder.elsewhere == {b.id, d.id}


def test_a_pair_is_judged_only_on_windows_that_arrived_after_it() -> None:
    gate = _gate([])
    wfs = list(stream_workflows(gate.base, 4, 120))

    measured: list[int] = []

    def feed(batch: Sequence[Workflow]) -> list[int]:
        """The windows judged for a pair (those measured for fidelity only: `measured`)."""
        for wf in batch:
            gate.recorder.workflow(wf)
            gate.recorder.ended(wf.id, 10.0, True)
        got = []
        while (nxt := gate.next_window()) is not None:
            (got if nxt[1].judged else measured).append(nxt[0].index)
        return got

    assert feed(wfs[:50]) == [] and gate.skipped == 2  # windows 0 and 1: no pair
    assert measured == []  # nor a champion to measure them for
    gate.versions("v1", "v2")  # mid window 2: the challenger may have been fitted to it
    assert feed(wfs[50:70]) == [] and gate.skipped == 3  # window 2 closed, but began before
    assert measured == [2]  # replayed as served, for fidelity only
    assert feed(wfs[70:100]) == [3, 4]  # windows that arrived after the pair was set
    gate.versions("v1", "v3")  # exactly between windows: the next one is fresh
    assert feed(wfs[100:120]) == [5] and gate.skipped == 3
    gate.versions(None, None)
    assert gate.next_window() is None and not gate.waiting and measured == [2]


def test_a_window_no_pair_is_judged_on_is_measured_and_pooled_with_the_next_pairs() -> None:
    """Fidelity is the replay's: the champion's windows before a challenger came are
    replayed for fidelity only, and a new pair's first window is pooled with them."""
    loaded: list[str] = []
    gate = _gate(loaded)
    gate.versions("v1", None)  # a champion, no challenger
    _windows(gate, 40)
    nxt = gate.next_window()
    assert nxt is not None
    obs, job, judge = nxt
    assert job == Job("v1", None, judged=False)
    report = gate.judge_window(obs, job, judge)
    assert loaded == ["1"] and report.decision == MEASURED and not report.diffs
    assert gate.take(report, job) is None and not gate.reports  # no test to feed
    assert list(gate.measured) == [(job, report)]
    gate.versions("v1", "v2")
    _windows(gate, 40)
    nxt = gate.next_window()
    assert nxt is not None
    obs, pair, judge = nxt
    report = gate.judge_window(obs, pair, judge)
    assert report.own_fidelity is not None and len(report.diffs) == 2
    # pooled with the measured window: not this window's alone
    assert report.fidelity != report.own_fidelity


def test_a_window_that_began_before_the_challenger_is_measured_as_it_was_served() -> None:
    """Its workflows the challenger's slice served are played by the challenger."""
    loaded: list[str] = []
    gate = _gate(loaded)
    gate.versions("v1", "v2")
    sc = gate.base
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history_srpt", 4), gate.recorder, stream_workflows(sc, 4, 40),
        served=lambda wid: int(wid.rsplit("-", 1)[1]) % 3 != 0,  # a third on the slice
    )  # fmt: skip
    assert wins[0].elsewhere
    job = Job("v1", "v2", judged=False)
    report = gate.judge_window(wins[0], job, gate.judge)
    assert sorted(loaded) == ["1", "2"] and report.decision == MEASURED and not report.diffs
    assert gate.take(report, job) is None and not gate.reports
    # the slice's workflows were played by the (throttled) challenger: the champion's
    # workflows are predicted otherwise than with the champion on the slice too
    heft = lambda _s: SchedulerPolicy(HeftHistory("srpt"))  # noqa: E731
    same = ReplayJudge(gate.cfg, sc).measure(wins[0], heft, heft)
    assert report.own_fidelity is not None and same.own_fidelity is not None
    assert report.own_fidelity.predicted_jct_s != same.own_fidelity.predicted_jct_s


def test_a_window_served_across_a_promotion_is_replayed_with_each_champion() -> None:
    """The old champion's workflows of a window that straddles a promotion are played by
    the old champion, not by the new one the window is measured for."""
    loaded: list[str] = []
    gate = _gate(loaded)
    gate.versions("v2", None)  # v2 was promoted while the window's arrivals came
    sc = gate.base
    wins = record_run(
        lambda wfs, hook: Simulator(sc, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history_srpt", 4), gate.recorder, stream_workflows(sc, 4, 40),
    )  # fmt: skip
    w = wins[0]
    early = {x.id for x in w.workflows[:10]}
    straddling = replace(w, served_by={i: "v1" if i in early else "v2" for i in w.jct_s})
    job = Job("v2", None, judged=False)
    report = gate.judge_window(straddling, job, gate.judge)
    assert sorted(set(loaded)) == ["1", "2"] and report.decision == MEASURED
    alone = gate.judge_window(replace(w, served_by={i: "v2" for i in w.jct_s}), job, gate.judge)
    assert report.own_fidelity is not None and alone.own_fidelity is not None
    assert report.own_fidelity.predicted_jct_s != alone.own_fidelity.predicted_jct_s


def test_the_windows_after_a_promotion_are_measured_as_they_were_served() -> None:
    """After a promotion no pair is under test, and the windows (their warm-ups too) hold
    workflows the old champion and the new one's slice served: each is played by the
    version that served it. A window with a workflow of unknown version is not measured."""
    loaded: list[str] = []
    gate = _gate(loaded)
    gate.versions("v2", None)  # v2 was promoted; v1 served before, v2's slice alongside
    jobs: list[int] = []
    for i, wf in enumerate(stream_workflows(gate.base, 4, 60)):
        gate.recorder.workflow(wf)
        arm, version = ("challenger", "v2") if i % 3 == 0 else ("champion", "v1")
        if i >= 40:
            arm, version = "champion", "v2"
        gate.ended(Sample(wf.id, arm, version, 1.0, -0.5, 0.3, None, 10.0 + i))
        while (nxt := gate.next_window()) is not None:
            obs, job, judge = nxt
            assert job == Job("v2", None, judged=False)
            report = gate.judge_window(obs, job, judge)
            # replayed for fidelity only (these made-up JCTs are far from any replay's)
            assert report.decision in (MEASURED, UNRELIABLE) and not report.diffs
            assert report.own_fidelity is not None
            jobs.append(obs.index)
    assert jobs == [0, 1, 2] and sorted(set(loaded)) == ["1", "2"]

    unknown = _gate([])
    unknown.versions("v2", None)
    for wf in stream_workflows(unknown.base, 5, 40):
        unknown.recorder.workflow(wf)
        unknown.recorder.ended(wf.id, 10.0, True, served=False)  # whose slice: not recorded
    assert unknown.next_window() is None and unknown.skipped == 2
