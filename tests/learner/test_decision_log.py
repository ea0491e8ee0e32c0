"""The compact decision log: the observations the model saw, replayed bit for bit from one
logged view per policy call and a small record per task; the learner trains from it."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dagsched.core.heft import heft_order
from dagsched.core.observation import Observation, observe
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.wire import to_message, to_workflow
from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.daemon import call_log
from dagsched.daemon.call_log import PolicyCall, snapshot
from dagsched.learner.decision_log import (
    DecisionLogError,
    batch_observations,
    decode_view,
    encode_view,
    logged,
    task_view_from,
    task_view_record,
)
from dagsched.learner.joining import OutcomeJoiner
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.messages import (
    DecisionBatchMsg,
    DecisionMsg,
    LoggedTaskMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskStartedMsg,
    decode,
)
from dagsched.sim.config import RewardWeights, ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


@pytest.fixture(scope="module")
def champion() -> GNNScheduler:
    return load_bundle(CHAMPION, "v1")


def decision_point(n_tasks: int, warmup: int = 120) -> tuple[ClusterView, list[TaskView]]:
    """A busy view of the default 32-node cluster and `n_tasks` ready tasks of several
    workflows (least-loaded played the warm-up)."""
    sc = ScenarioConfig()
    sim = Simulator(sc, list(stream_workflows(sc, 3, 60)), seed=3)
    policy = make_policy("least_loaded", 3)
    tasks: list[TaskView] = []
    for step in range(10_000):
        batch = sim.advance()
        assert batch is not None
        if step >= warmup:
            tasks += [task_view(t, sim) for t in batch]  # with its family history
            if len(tasks) >= n_tasks:
                break
        sim.apply(policy.decide(sim, batch), batch)
    return cluster_view(sim), tasks[:n_tasks]


def logged_call(sched: GNNScheduler, view: ClusterView, tvs: list[TaskView]) -> DecisionBatchMsg:
    """What the daemon logs for one call of `sched` (every task new)."""
    placements = sched.place(view, tvs)
    call = PolicyCall("champion", "v1", time.time(), snapshot(sched, view, tvs, "v1"))
    for i, (tv, p) in enumerate(zip(tvs, placements, strict=True)):
        m = TaskReadyMsg(workflow_id=tv.workflow.id, task=tv.idx, attempt=tv.attempt)
        call.add(m, tv, p, (sched.last_units[i], sched.last_values[i]))
    call.new = [True] * len(tvs)
    rec = call.record()
    assert rec is not None
    keys, raw = rec
    assert keys == [f"{tv.workflow.id}/{tv.idx}:{tv.attempt}" for tv in tvs]
    msg = decode(raw)  # what travels on dagsched.decisionlog decodes as a wire message
    assert isinstance(msg, DecisionBatchMsg)
    return msg


def same(a: Observation | None, b: Observation) -> bool:
    assert a is not None
    return all(
        np.array_equal(getattr(a, f), getattr(b, f))
        for f in ("nodes", "mask", "cluster", "dag", "edges", "base", "base_logits")
    ) and (a.task_idx == b.task_idx)


def over_the_wire(tvs: list[TaskView]) -> dict[str, Workflow]:
    """The workflows as a reader of dagsched.tasks rebuilds them."""
    return {tv.workflow.id: to_workflow(to_message(tv.workflow), 5000) for tv in tvs}


@pytest.mark.parametrize("n_tasks", [1, 24])
def test_replay_gives_back_exactly_what_the_model_saw(champion, n_tasks):
    view, tvs = decision_point(n_tasks)
    assert len({tv.workflow.id for tv in tvs}) > (1 if n_tasks > 1 else 0)
    msg = logged_call(champion, view, tvs)
    seen = list(champion.last_observations)
    wfs = over_the_wire(tvs)
    replayed = batch_observations(msg, wfs.get)
    assert len(replayed) == len(seen)
    for got, want in zip(replayed, seen, strict=True):
        assert same(got, want)
    # what it costs: the view once, a few hundred bytes per task (the old log: ~10 KB each);
    # the family history summary is ~150 of them
    per_task = len(msg.encode()) / n_tasks
    assert per_task < (3_500 if n_tasks == 1 else 850), per_task
    # an unknown workflow stops the replay at that task: later ones depend on its placement
    first = tvs[0].workflow.id
    cut = batch_observations(msg, lambda w: None if w == first else wfs.get(w))
    assert cut[0] is None and all(o is None for o in cut)


def test_view_codec_round_trips_every_field():
    """Every field comes back; the running attempts as what they tell a scheduler at the
    view's time (each node's first expected end), so a logged call replays on them."""
    view, _ = decision_point(1)
    assert view.running is not None and np.isfinite(view.first_ends_s()).any()  # type: ignore[arg-type]
    back = decode_view(encode_view(view))
    assert back.running is None
    np.testing.assert_array_equal(back.first_wait_s(), view.first_wait_s())
    told = replace(view, first_end_s=view.first_ends_s(), running=None)
    for name in ClusterView.__slots__:
        a, b = getattr(told, name), getattr(back, name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b), name
        else:
            assert a == b, name


def test_the_learner_joins_a_batch_and_trains_on_the_replayed_observation(champion):
    view, tvs = decision_point(6)
    msg = logged_call(champion, view, tvs)
    seen = list(champion.last_observations)
    joiner = OutcomeJoiner(RewardWeights())
    done = []
    k = 4  # the fifth task of the call: its observation depends on four earlier placements
    tv = tvs[k]
    common = {"workflow_id": tv.workflow.id, "task": tv.idx, "attempt": tv.attempt}
    dec = DecisionMsg(
        **common, node=view.node_ids[msg.tasks[k].node_index], cpu=0.2, mem=0.3, max_retries=3,
        model_version="v1", arm="champion", log_prob=-1.0, decided_at=1.0, latency_ms=1.0,
    )  # fmt: skip
    # the log may come first, the workflows last: the join waits for both
    for m in (msg, dec, TaskStartedMsg(**common, node=dec.node, at=0.0)):
        done += joiner.add(m, now=0.0)
    done += joiner.add(TaskFinishedMsg(**common, node=dec.node, at=50.0), now=0.0)
    assert done == []
    for wf_id in dict.fromkeys(t.workflow.id for t in tvs):
        wf = next(t.workflow for t in tvs if t.workflow.id == wf_id)
        done += joiner.add(to_message(wf), now=0.0)
    (j,) = done
    assert j.trainable and j.key == (f"{tv.workflow.id}/{tv.idx}", tv.attempt)
    assert j.node_index == msg.tasks[k].node_index and j.unit == champion.last_units[k]
    assert same(j.observation, seen[k])
    # one record yields one logged decision per new task, in order
    assert [d.key for d in logged(msg)] == [(f"{t.workflow.id}/{t.idx}", t.attempt) for t in tvs]


def test_a_version_whose_snapshot_does_not_replay_logs_nothing_more() -> None:
    view, tvs = decision_point(3)
    right = [observe(view, tv) for tv in tvs]
    first, other = heft_order(tvs)[:2]  # the first task placed, checked against the view
    wrong_obs = list(right)
    wrong_obs[first] = right[other]
    wrong = SimpleNamespace(last_observations=wrong_obs)  # not the first placed task's
    assert snapshot(SimpleNamespace(last_observations=right), view, tvs, "v7") is not None
    assert snapshot(wrong, view, tvs, "v8") is None
    # the version stays off even for calls that would replay; another version logs
    assert snapshot(SimpleNamespace(last_observations=right), view, tvs, "v8") is None
    assert snapshot(SimpleNamespace(last_observations=right), view, tvs, "v9") is not None


def test_the_replay_check_samples_a_versions_calls_after_its_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    view, tvs = decision_point(2)
    right = SimpleNamespace(last_observations=[observe(view, tv) for tv in tvs])
    checked = []

    def counted(v: ClusterView, tv: TaskView) -> Observation:
        checked.append(tv)
        return observe(v, tv)

    monkeypatch.setattr(call_log, "observe", counted)
    calls = call_log.FULL_CHECKS + 3 * call_log.SAMPLE_EVERY
    assert all(snapshot(right, view, tvs, "v-sampled") is not None for _ in range(calls))
    assert len(checked) == call_log.FULL_CHECKS + 3


def _logged(tv: TaskView, view: dict) -> LoggedTaskMsg:
    return LoggedTaskMsg(
        workflow_id=tv.workflow.id,
        task=tv.idx,
        attempt=tv.attempt,
        new=True,
        node_index=0,
        cpu=0.5,
        mem=0.5,
        log_prob=0.0,
        view=view,
    )


def test_where_a_workflow_stands_is_logged_as_a_bitmap_and_old_index_lists_still_read() -> None:
    _, tvs = decision_point(4)
    for tv in tvs:
        rec = task_view_record(tv)
        assert set(rec["done"]) == {"bits", "n"}
        back = task_view_from(_logged(tv, rec), tv.workflow)
        np.testing.assert_array_equal(back.done, tv.done)
        np.testing.assert_array_equal(back.active, tv.active)
        old = dict(rec)  # as logs written before the bitmaps
        for name in ("done", "active"):
            old[name] = {"true_at": np.flatnonzero(getattr(tv, name)).tolist(), "n": tv.done.size}
        back = task_view_from(_logged(tv, old), tv.workflow)
        np.testing.assert_array_equal(back.active, tv.active)
    bad = dict(task_view_record(tvs[0]), done={"bits": "ff" * 64, "n": 3})
    with pytest.raises(DecisionLogError, match="bits"):
        task_view_from(_logged(tvs[0], bad), tvs[0].workflow)


def test_a_map_stage_logs_its_masks_once_per_call_and_compactly() -> None:
    wf = Workflow.build(
        "stage",
        [TaskSpec(f"m{i}", TaskType.CPU, 10, 1, 1) for i in range(2_000)],
        [],
        deadline_s=1e6,
    )
    done = np.zeros(wf.size, dtype=bool)
    active = np.ones(wf.size, dtype=bool)  # shared by the siblings, as the daemon's masks
    tvs = [TaskView(wf, i, 0, done, active, [], -1, 100.0) for i in range(50)]
    memo: dict[int, object] = {}
    recs = [task_view_record(tv, memo) for tv in tvs]
    assert all(r["active"] is recs[0]["active"] for r in recs)  # encoded once
    assert len(json.dumps(recs[0])) < 1_200  # 2,000 flags in ~500 hex characters
