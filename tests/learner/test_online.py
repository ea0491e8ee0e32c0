"""Online learning: the join computes the simulator's reward; fine-tuning moves only the heads."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dagsched.core.observation import observation_to_dict
from dagsched.learner.curriculum import Curriculum
from dagsched.learner.joining import Joined, OutcomeJoiner
from dagsched.learner.online import FinetuneConfig, finetune_heads
from dagsched.learner.train import demonstrations
from dagsched.policy.model import ACTOR_HEADS, ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.schemas.messages import (
    DecisionLogMsg,
    DecisionMsg,
    NodeHeartbeatMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.sim.config import RewardWeights, ScenarioConfig
from dagsched.sim.reward import TaskOutcome, decision_reward


@pytest.fixture(scope="module")
def transitions() -> list[Joined]:
    obs, nodes, units = demonstrations(
        Curriculum(ScenarioConfig(), workflows_per_episode=3), 1, "heft", seed=1
    )
    rng = np.random.default_rng(0)
    return [
        Joined(
            key=(f"wf/{i}", 0),
            workflow_id="wf",
            arm="champion",
            version="v1",
            reward=float(rng.normal(-0.5, 0.3)),
            failed=False,
            on_time=True,
            end_at=0.0,
            max_retries=3,
            observation=o,
            node_index=n,
            unit=list(u),
            log_prob=0.0,
        )
        for i, (o, n, u) in enumerate(zip(obs[:160], nodes, units, strict=False))
    ]


def test_only_head_parameters_change(
    model: ActorCritic, normalizer: FeatureNormalizer, transitions: list[Joined]
) -> None:
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = FinetuneConfig(learning_rate=1e-3, target_kl=10.0, update_epochs=2)
    result = finetune_heads(model, normalizer, transitions, cfg)
    after = result.model.state_dict()
    changed_heads = 0
    for name, tensor in after.items():
        if name.split(".")[0] in ACTOR_HEADS:
            changed_heads += int(not torch.equal(tensor, before[name]))
        else:
            assert torch.equal(tensor, before[name]), f"{name} changed"
    assert changed_heads > 0
    # the champion itself is untouched
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])
    assert result.metrics["online/transitions"] == len(transitions)
    assert result.metrics["losses/grad_norm"] >= 0


def test_kl_limit_stops_early(
    model: ActorCritic, normalizer: FeatureNormalizer, transitions: list[Joined]
) -> None:
    cfg = FinetuneConfig(learning_rate=5e-2, target_kl=1e-4, update_epochs=5, minibatch_size=32)
    result = finetune_heads(model, normalizer, transitions, cfg)
    assert result.metrics["online/kl_stopped"] == 1.0
    assert result.metrics["online/steps"] < 5 * len(transitions) / 32


def _messages(observation: dict[str, object]) -> list[object]:
    wf = WorkflowMsg(
        workflow_id="wf-1",
        tasks=[
            TaskSpecMsg(name="a", type="cpu", duration_s=10, cpu_cores=2, mem_gb=4),
            TaskSpecMsg(name="b", type="cpu", duration_s=10, cpu_cores=2, mem_gb=4),
        ],
        edges=[(0, 1)],
        deadline_s=40.0,
    )
    hb = NodeHeartbeatMsg(node="n0", at=0, kind="cpu", zone=0, cores=16, mem_gb=64)
    dec = DecisionMsg(
        workflow_id="wf-1",
        task=0,
        attempt=0,
        node="n0",
        cpu=0.25,
        mem=0.2,
        max_retries=3,
        model_version="v1",
        arm="champion",
        log_prob=-1.0,
        decided_at=1.0,
        latency_ms=1.0,
    )
    log = DecisionLogMsg(
        workflow_id="wf-1",
        task=0,
        attempt=0,
        model_version="v1",
        arm="champion",
        node_index=0,
        unit=[0.2, 0.1, 0.5, 0.5],
        log_prob=-1.0,
        value=0.0,
        decided_at=1.0,
        observation=observation,
    )
    return [
        wf,
        hb,
        dec,
        TaskStartedMsg(workflow_id="wf-1", task=0, attempt=0, node="n0", at=0.0),
        TaskFinishedMsg(workflow_id="wf-1", task=0, attempt=0, node="n0", at=30.0),
        log,
    ]


def test_join_uses_the_simulator_reward(transitions: list[Joined]) -> None:
    obs = transitions[0].observation
    assert obs is not None
    raw = observation_to_dict(obs)
    joiner = OutcomeJoiner(RewardWeights())
    done: list[Joined] = []
    for msg in _messages(raw):
        done += joiner.add(msg, now=0.0)
    assert len(done) == 1 and done[0].trainable
    j = done[0]
    # sub-deadline of task 0 = 40 * 10 / 20 = 20 s; finished at 30: 10 s late of 40
    cpu_used = np.asarray(raw["nodes"], dtype=np.float64)[:, 0]
    after = cpu_used.copy()
    after[0] += 0.25
    expected = TaskOutcome(
        lateness=10 / 40,
        failed=False,
        reserved_core_s=0.25 * 16 * 30,
        ideal_core_s=20.0,
        # the Jain index of node CPU use with this decision's own 0.25 taken on node 0
        jain_at_decision=float(after.sum() ** 2 / (len(after) * (after**2).sum())),
        migrated=False,
        transfer_s=float(np.expm1(np.asarray(raw["nodes"])[0, 11])),
        compute_s=30 - float(np.expm1(np.asarray(raw["nodes"])[0, 11])),
    )
    assert j.reward == pytest.approx(decision_reward(expected, RewardWeights()), rel=1e-5)
    assert not j.on_time and j.arm == "champion" and j.version == "v1"


def _heartbeat(node: str, at: float) -> NodeHeartbeatMsg:
    return NodeHeartbeatMsg(node=node, at=at, kind="cpu", zone=0, cores=16, mem_gb=64)


def test_unreported_attempt_gets_the_default_outcome() -> None:
    joiner = OutcomeJoiner(RewardWeights(), timeout_s=60)
    msgs = _messages({})[:3]  # workflow, heartbeat, decision: never started or finished
    for m in msgs:
        assert joiner.add(m, now=0.0) == []
    # the wall moving on is no evidence of loss: the job queue's clock has not
    assert joiner.expire(now=1e6) == []
    joiner.add(_heartbeat("n1", 30.0), now=0.0)  # another node; n0 has gone silent
    assert joiner.expire(now=0.0) == []
    joiner.add(_heartbeat("n1", 61.0), now=0.0)
    (j,) = joiner.expire(now=0.0)
    assert j.failed and j.defaulted and not j.trainable
    assert joiner.pending == {}


def test_an_attempt_on_a_live_node_waits_for_its_end_however_long_it_takes() -> None:
    joiner = OutcomeJoiner(RewardWeights(), timeout_s=60)
    joiner.wait_for_log = False
    wf, hb, dec = _messages({})[:3]
    for m in (wf, hb, dec, TaskStartedMsg(workflow_id="wf-1", task=0, attempt=0, node="n0",
                                          at=0.0)):  # fmt: skip
        joiner.add(m, now=0.0)
    for t in range(30, 3600, 30):  # an hour of the node's heartbeats while it runs
        joiner.add(_heartbeat("n0", float(t)), now=float(t))
        assert joiner.expire(now=float(t)) == []
    end = TaskFinishedMsg(workflow_id="wf-1", task=0, attempt=0, node="n0", at=3600.0)
    (j,) = joiner.add(end, now=3600.0)
    assert not j.failed and not j.defaulted and j.end_at == 3600.0


def test_an_attempt_asked_again_before_it_started_is_dropped_not_failed() -> None:
    joiner = OutcomeJoiner(RewardWeights(), timeout_s=60)
    joiner.wait_for_log = False
    wf, hb, dec = _messages({})[:3]
    for m in (wf, hb, dec):
        joiner.add(m, now=0.0)
    # its node crashed while it was queued there: the job queue asks for attempt 1
    again = dec.model_copy(update={"attempt": 1, "node": "n1"})
    joiner.add(_heartbeat("n1", 5.0), now=0.0)
    joiner.add(TaskReadyMsg(workflow_id="wf-1", task=0, attempt=1, at=5.0), now=0.0)
    joiner.add(again, now=0.0)
    joiner.add(TaskStartedMsg(workflow_id="wf-1", task=0, attempt=1, node="n1", at=10.0), 0.0)
    for t in (40.0, 70.0, 100.0):
        joiner.add(_heartbeat("n0", t), now=0.0)  # n0 came back: no word of attempt 0
        joiner.add(_heartbeat("n1", t), now=0.0)
        assert joiner.expire(now=0.0) == []
    assert list(joiner.pending) == [("wf-1/0", 1)]  # attempt 0 dropped, not a failure
    end = TaskFinishedMsg(workflow_id="wf-1", task=0, attempt=1, node="n1", at=120.0)
    (j,) = joiner.add(end, now=0.0)
    assert j.key == ("wf-1/0", 1) and not j.failed


def test_failure_event_is_a_failed_outcome() -> None:
    joiner = OutcomeJoiner(RewardWeights(), timeout_s=60)
    msgs = [
        *_messages({})[:3],
        TaskFailedMsg(workflow_id="wf-1", task=0, attempt=0, node="n0", at=5.0, reason="oom"),
    ]
    done = [j for m in msgs for j in joiner.add(m, now=0.0)]
    assert done == []  # waits a while for its decision log
    (j,) = joiner.expire(now=61.0)
    assert j.failed and not j.defaulted and not j.trainable


def test_outcomes_that_arrive_before_their_workflow_are_joined_when_it_comes(
    transitions: list[Joined],
) -> None:
    obs = transitions[0].observation
    assert obs is not None
    msgs = _messages(observation_to_dict(obs))
    joiner = OutcomeJoiner(RewardWeights())
    early = [j for m in msgs[1:] for j in joiner.add(m, now=0.0)]
    assert early == []
    (j,) = joiner.add(msgs[0], now=0.0)  # the workflow, last
    assert j.trainable and joiner.pending == {} and joiner.waiting == {}


def test_a_decision_logged_with_the_older_three_values_is_not_trainable(
    transitions: list[Joined],
) -> None:
    """Logs of a version from before the priority head carry three unit values; a four-value
    head cannot evaluate them, so the learner leaves them out rather than fail."""
    from dataclasses import replace

    j = next(t for t in transitions if t.trainable)
    assert j.unit is not None and len(j.unit) == 4
    assert not replace(j, unit=j.unit[:3]).trainable


def _attempt(task: str, attempt: int, reward: float) -> Joined:
    return Joined(
        key=(task, attempt),
        workflow_id=task.split("/")[0],
        arm="champion",
        version="v1",
        reward=reward,
        failed=False,
        on_time=True,
        end_at=0.0,
        max_retries=3,
    )


def test_task_credit_charges_an_attempt_with_what_its_retries_cost() -> None:
    from dagsched.learner.online import task_returns

    # wf/0: OOM-killed (-0.5), then a retry that finished late (-2.0); wf/1: one clean attempt
    data = [_attempt("wf/0", 1, -2.0), _attempt("wf/1", 0, -0.1), _attempt("wf/0", 0, -0.5)]
    assert task_returns(data) == pytest.approx([-2.0, -0.1, -2.5])


def test_credit_is_a_setting_with_a_clear_error(
    model: ActorCritic, normalizer: FeatureNormalizer, transitions: list[Joined]
) -> None:
    assert FinetuneConfig().credit == "task"
    with pytest.raises(ValueError, match="credit"):
        finetune_heads(model, normalizer, transitions, FinetuneConfig(credit="workflow"))


def test_a_round_learns_from_the_exploration_slice_when_it_is_on() -> None:
    from dataclasses import replace

    from dagsched.learner.online import learning_window

    served = [_attempt("wf/0", 0, -0.1), _attempt("wf/1", 0, -0.2)]
    explored = replace(_attempt("wf/2", 0, -0.3), arm="explore")
    assert learning_window([*served, explored], explore=True) == [explored]
    assert learning_window([*served, explored], explore=False) == [*served, explored]
    assert learning_window(served, explore=True) == served  # none sampled yet
