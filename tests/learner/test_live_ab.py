"""The evaluator's core: workflows become samples; the judge promotes, retires, rolls back."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest

from dagsched.learner.adjustment import congestion, covariates
from dagsched.learner.decision_log import batch_message, encode_view
from dagsched.learner.joining import Joined, OutcomeJoiner
from dagsched.learner.live_ab import GUARDRAIL_MIN_SAMPLES, Judge, Sample, WorkflowOutcomes
from dagsched.learner.sequential import DecisionRule
from dagsched.schemas.messages import DecisionBatchMsg, LoggedTaskMsg, TaskSpecMsg, WorkflowMsg
from dagsched.sim.config import RewardWeights
from tests.learner.test_adjustment import four_nodes

RULE = DecisionRule(min_samples=50, max_samples=2000)


def _joined(wf: str, task: int, end_at: float, failed: bool = False, attempt: int = 0) -> Joined:
    return Joined(
        key=(f"{wf}/{task}", attempt),
        workflow_id=wf,
        arm="challenger",
        version="v2",
        reward=-0.5,
        failed=failed,
        on_time=not failed,
        end_at=end_at,
        max_retries=2,
    )


def test_a_workflow_is_one_sample_when_all_tasks_finish_or_one_fails_for_good() -> None:
    joiner = OutcomeJoiner(RewardWeights())
    spec = TaskSpecMsg(name="a", type="cpu", duration_s=10, cpu_cores=1, mem_gb=1)
    for wf in ("wf-1", "wf-2"):
        msg = WorkflowMsg(workflow_id=wf, tasks=[spec, spec], edges=[(0, 1)], deadline_s=50)
        joiner.add(msg, now=0)
    outcomes = WorkflowOutcomes(joiner)
    assert outcomes.add(_joined("wf-1", 0, 10)) is None
    s = outcomes.add(_joined("wf-1", 1, 60))
    assert s is not None and (s.sla, s.arm, s.version) == (0.0, "challenger", "v2")  # late
    assert s.speed == pytest.approx(-math.log(60 / 50))  # -log(JCT / deadline)
    # max_retries=2: two failures are retried, the third ends the workflow (as in the simulator)
    assert outcomes.add(_joined("wf-2", 0, 5, failed=True)) is None
    assert outcomes.add(_joined("wf-2", 0, 7, failed=True, attempt=1)) is None
    s = outcomes.add(_joined("wf-2", 0, 9, failed=True, attempt=2))
    assert s is not None and s.sla == 0.0 and s.reward == -0.5
    assert s.speed == pytest.approx(-math.log(2))  # failed early: counted as 2 deadlines
    # the exploration slice is sampled, for the learner: its workflow ends (the replay
    # judge's recorder closes windows on it) but no test may count it
    joiner.add(WorkflowMsg(workflow_id="wf-3", tasks=[spec, spec], edges=[(0, 1)],
                           deadline_s=50), now=0)  # fmt: skip
    explored = [replace(_joined("wf-3", t, 10), arm="explore") for t in (0, 1)]
    assert outcomes.add(explored[0]) is None
    s = outcomes.add(explored[1])
    assert s is not None and s.arm == "explore" and not s.judged
    assert (s.sla, s.jct_s) == (1.0, 10.0)


def test_a_workflow_takes_its_covariates_from_the_batch_that_placed_its_first_task() -> None:
    joiner = OutcomeJoiner(RewardWeights())
    spec = TaskSpecMsg(name="a", type="cpu", duration_s=10, cpu_cores=1, mem_gb=1)
    for wf in ("wf-1", "wf-2", "wf-3"):
        joiner.add(WorkflowMsg(workflow_id=wf, tasks=[spec], edges=[], deadline_s=50), now=0)
    outcomes = WorkflowOutcomes(joiner)
    view = encode_view(four_nodes())

    def batch(arm: str, wf: str) -> DecisionBatchMsg:
        task = LoggedTaskMsg(
            workflow_id=wf, task=0, attempt=0, new=True, node_index=0, cpu=0.1, mem=0.1
        )
        return batch_message(model_version="v2", arm=arm, decided_at=0.0, view=view, tasks=[task])

    outcomes.note(batch("challenger", "wf-1"))
    outcomes.note(batch("explore", "wf-2"))  # never judged: nothing kept for it
    assert set(outcomes.congestion) == {"wf-1"}
    s1 = outcomes.add(_joined("wf-1", 0, 10))
    s3 = outcomes.add(_joined("wf-3", 0, 10))  # its batch never seen: judged unadjusted
    assert s1 is not None and s3 is not None
    want = covariates(joiner.workflows["wf-1"].wf, congestion(four_nodes()))
    assert s1.covariates == want and s3.covariates is None
    assert outcomes.with_covariates == 1 and not outcomes.congestion


def _feed(judge: Judge, rng: np.random.Generator, version: str, p: float) -> str | None:
    met = float(rng.random() < p)
    s = Sample("wf", "x", version, met, float(rng.normal(-0.5, 0.1)), float(rng.normal(0.5, 1)))
    action = judge.add(s)
    return action[0] if action else None


def test_judge_promotes_a_better_challenger_then_rolls_back_a_bad_champion() -> None:
    rng = np.random.default_rng(0)
    judge = Judge(RULE, guardrail_window=500)
    judge.versions("v1", "v2")
    action = None
    for i in range(4000):
        action = _feed(judge, rng, "v2" if i % 2 else "v1", 0.95 if i % 2 else 0.7)
        if action:
            break
    assert action == "promote"
    judge.promoted()
    judge.versions("v2", None)
    for _ in range(500):  # the new champion turns out much worse than the old one
        action = _feed(judge, rng, "v2", 0.3)
        if action:
            break
    assert action == "rollback"


def test_judge_ignores_versions_not_under_test() -> None:
    rng = np.random.default_rng(1)
    judge = Judge(RULE, guardrail_window=10)
    judge.versions("v1", "v2")
    assert all(_feed(judge, rng, "v9", 1.0) is None for _ in range(500))
    assert judge.test.arms["challenger"]["sla"].n == 0


def test_judge_rolls_back_a_champion_promoted_by_hand() -> None:
    rng = np.random.default_rng(2)
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v1", None)
    assert all(_feed(judge, rng, "v1", 0.9) is None for _ in range(200))  # no test running
    judge.versions("v2", None, previous="v1")  # `dagsched models promote 2`, by hand
    action = None
    for _ in range(300):
        action = _feed(judge, rng, "v2", 0.4)
        if action:
            break
    assert action == "rollback"
    assert judge.watch is None


def test_the_guardrail_clears_a_champion_as_good_as_the_old_one_after_its_window() -> None:
    rng = np.random.default_rng(4)
    judge = Judge(RULE, guardrail_window=50)
    judge.versions("v1", None)
    assert all(_feed(judge, rng, "v1", 0.9) is None for _ in range(200))
    judge.versions("v2", None, previous="v1")
    assert all(_feed(judge, rng, "v2", 0.9) is None for _ in range(49))
    assert judge.watch is not None and not judge.cleared
    assert _feed(judge, rng, "v2", 0.9) == "clear"
    assert judge.watch is None
    [(version, stats)] = judge.cleared
    assert version == "v2" and stats.n_challenger == 50 and stats.upper >= 0


def _holdback(judge: Judge, rng: np.random.Generator, version: str, p: float) -> str | None:
    met = float(rng.random() < p)
    action = judge.add(Sample("wf", "holdback", version, met, -0.5, 0.5))
    return action[0] if action else None


def _watched_in_a_world_that_slows(holdback: bool, new_sla: float) -> list[str]:
    """v1 meets 90% of deadlines, v2 is promoted by hand, then the world slows: the old
    champion, in its holdback slice, meets 60%. The actions the guardrail takes."""
    rng = np.random.default_rng(5)
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v1", None)
    assert all(_feed(judge, rng, "v1", 0.9) is None for _ in range(300))
    judge.versions("v2", None, previous="v1", holdback="v1" if holdback else None)
    actions = []
    for i in range(300):
        if holdback and i % 4 == 0:
            actions.append(_holdback(judge, rng, "v1", 0.6))
        actions.append(_feed(judge, rng, "v2", new_sla))
    return [a for a in actions if a]


def test_the_holdback_slice_keeps_a_slowing_world_from_rolling_back_a_good_champion() -> None:
    assert _watched_in_a_world_that_slows(holdback=False, new_sla=0.6) == ["rollback"]
    assert _watched_in_a_world_that_slows(holdback=True, new_sla=0.6) == ["clear"]
    # a champion worse than the holdback in the same minutes is still rolled back
    assert _watched_in_a_world_that_slows(holdback=True, new_sla=0.3) == ["rollback"]


def test_with_a_holdback_the_guardrail_waits_for_its_slice_not_the_record_before() -> None:
    rng = np.random.default_rng(7)
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v1", None)
    assert all(_feed(judge, rng, "v1", 0.95) is None for _ in range(300))
    judge.versions("v2", None, previous="v1", holdback="v1")
    # far below the record before, and no holdback workflow has finished yet: no verdict
    assert all(_feed(judge, rng, "v2", 0.3) is None for _ in range(100))
    actions: list[str | None] = []
    for _ in range(30):  # one holdback workflow in ten, as at `holdback_share` 0.1
        actions.append(_holdback(judge, rng, "v1", 0.95))
        actions += [_feed(judge, rng, "v2", 0.3) for _ in range(9)]
    assert [a for a in actions if a] == ["rollback"]
    assert actions.index("rollback") > 9 * 10  # judged once the slice had ten workflows


def test_holdback_workflows_of_another_version_are_not_the_baseline() -> None:
    rng = np.random.default_rng(6)
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v1", None)
    judge.versions("v2", None, previous="v1")
    assert all(_holdback(judge, rng, "v7", 0.9) is None for _ in range(50))
    assert judge.watch is not None and judge.watch.holdback.n == 0
    assert judge.test.arms["champion"]["sla"].n == 0 and judge.served.n == 0


def test_judge_does_not_watch_a_champion_change_that_is_no_promotion() -> None:
    rng = np.random.default_rng(3)
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v2", None)
    assert all(_feed(judge, rng, "v2", 0.9) is None for _ in range(200))
    judge.versions("v1", None, previous=None)  # a rollback: no previous left
    assert judge.watch is None
    assert all(_feed(judge, rng, "v1", 0.4) is None for _ in range(300))


def test_one_late_workflow_does_not_roll_back_a_hand_promotion() -> None:
    """The guardrail waits for `GUARDRAIL_MIN_SAMPLES` of the new champion's workflows: a
    single miss after an old champion at SLA 0.99 is no evidence."""
    judge = Judge(RULE, guardrail_window=300)
    judge.versions("v1", None)
    for i in range(100):
        judge.add(Sample(f"wf-{i}", "champion", "v1", float(i != 0), -0.5, 0.5))
    judge.versions("v2", None, previous="v1")
    late = Sample("wf-a", "champion", "v2", 0.0, -0.5, 0.5)
    assert judge.add(late) is None
    on_time = [Sample(f"wf-b{i}", "champion", "v2", 1.0, -0.5, 0.5) for i in range(30)]
    assert all(judge.add(s) is None for s in on_time)
    # a champion that misses every deadline is still rolled back, at the minimum
    judge.versions("v3", None, previous="v2")
    actions = [judge.add(Sample(f"wf-c{i}", "champion", "v3", 0.0, -0.5, 0.5)) for i in range(12)]
    assert actions.index(next(a for a in actions if a)) == GUARDRAIL_MIN_SAMPLES - 1
