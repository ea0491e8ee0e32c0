"""The learning loop in the simulator: rounds move only the heads, the split follows the
daemon's buckets, verdicts move the versions, and without a learner nothing changes."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from dagsched.learner.live_ab import Sample
from dagsched.learner.online import FinetuneConfig
from dagsched.learner.sequential import Verdict
from dagsched.learner.sim_loop import LoopConfig, SimLoop
from dagsched.policy.bundle import load_bundle
from dagsched.policy.model import ACTOR_HEADS
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.ab import workflow_bucket
from dagsched.service_config import EvaluatorSettings
from dagsched.sim.config import DriftConfig, ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import generate_workflows
from tests.sim.conftest import small_scenario

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"
FAST = FinetuneConfig(update_epochs=1, minibatch_size=32)


@pytest.fixture(scope="module")
def champion() -> Iterator[GNNScheduler]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny batches: more threads only contend
    yield load_bundle(CHAMPION, "v1")
    torch.set_num_threads(threads)


def _scenario(workflows: int = 12) -> ScenarioConfig:
    return replace(small_scenario(workflows=workflows), drift=DriftConfig(at_s=600.0))


def _run(champion: GNNScheduler, cfg: LoopConfig, workflows: int = 12) -> tuple[SimLoop, Simulator]:
    sc = _scenario(workflows)
    loop = SimLoop(champion, cfg, seed=3)
    sim = loop.simulator(sc, generate_workflows(sc, 3), 3)
    loop.run(sim)
    return loop, sim


def test_rounds_change_only_the_actor_heads_and_challengers_serve_their_bucket(
    champion: GNNScheduler,
) -> None:
    cfg = LoopConfig(
        share=0.5, every_n=40, window=200, finetune=FAST, replace_challenger=True, learner="ppo"
    )
    loop, _ = _run(champion, cfg)
    rounds = [e for e in loop.events if e.kind == "round"]
    assert len(rounds) >= 2
    assert rounds[0].detail["from"] == "v1" and rounds[0].detail["transitions"] >= 40
    base = champion.model.state_dict()
    for e in rounds:
        state = loop.versions[e.version].model.state_dict()
        changed = {k for k, v in state.items() if not torch.equal(v, base[k])}
        assert changed, f"{e.version} did not move"
        assert {k.split(".")[0] for k in changed} <= set(ACTOR_HEADS), changed
        assert loop.parent[e.version] == e.champion
    decided = list(loop.window)
    assert {j.arm for j in decided} == {"champion", "challenger"}
    for j in decided:
        if j.arm == "challenger":
            assert workflow_bucket(j.workflow_id) < 0.5 and j.version != "v1"
        assert j.trainable and j.log_prob <= 0.0


def test_champion_alone_records_every_outcome_and_never_changes_versions(
    champion: GNNScheduler,
) -> None:
    loop, sim = _run(champion, LoopConfig(learn=False, every_n=5, window=10**6))
    assert loop.events == [] and list(loop.versions) == ["v1"] and loop.challenger is None
    assert {(w.arm, w.version) for w in loop.workflows.values()} == {("champion", "v1")}
    m = sim.metrics
    assert len(loop.window) == m.tasks_done + m.task_failures
    assert sum(j.reward for j in loop.window) == pytest.approx(m.total_reward)
    ended = [w for w in loop.workflows.values() if w.end_s is not None]
    assert len(ended) == m.workflows_done + m.workflows_failed
    assert sum(w.met for w in ended) == m.met_deadline


def test_progress_counts_the_workflows_as_they_end(champion: GNNScheduler) -> None:
    sc = _scenario()
    loop = SimLoop(champion, LoopConfig(learn=False), seed=3)
    seen: list[int] = []
    loop.run(loop.simulator(sc, generate_workflows(sc, 3), 3), progress=seen.append)
    ended = [w for w in loop.workflows.values() if w.end_s is not None]
    assert seen == sorted(set(seen)) and seen[0] >= 1  # each count once, growing
    assert seen[-1] == len(ended) == 12


def test_one_challenger_under_test_at_a_time(champion: GNNScheduler) -> None:
    # min_samples beyond the run: no verdict, so the first challenger is never replaced
    ev = LoopConfig().evaluator.model_copy(update={"min_samples": 10**6})
    loop, _ = _run(
        champion, LoopConfig(share=0.5, every_n=40, finetune=FAST, evaluator=ev, learner="ppo")
    )
    assert [e.kind for e in loop.events] == ["round"] and loop.challenger == "v2"


def test_without_a_challenger_nothing_is_promoted(champion: GNNScheduler) -> None:
    loop, _ = _run(champion, LoopConfig(share=0.5, every_n=10**9))
    assert loop.events == [] and loop.champion == "v1"
    assert all(j.arm == "champion" for j in loop.window)


def test_split_matches_the_daemon_and_verdicts_move_the_versions(
    champion: GNNScheduler,
) -> None:
    loop = SimLoop(champion, LoopConfig(share=0.3))
    ids = [f"wf-{i:07d}" for i in range(400)]
    assert all(loop.arm_of(i) == "champion" for i in ids)  # no challenger yet
    loop.versions["v2"] = champion
    loop.parent["v2"] = "v1"
    loop.challenger = "v2"
    loop.judge.versions("v1", "v2")  # as a round does
    arms = [loop.arm_of(i) for i in ids]
    assert arms == ["challenger" if workflow_bucket(i) < 0.3 else "champion" for i in ids]
    assert 0.2 < arms.count("challenger") / len(ids) < 0.4
    verdict = Verdict("promote", "better", "rule", {})
    loop.act(10.0, "promote", verdict)
    assert (loop.champion, loop.previous, loop.challenger) == ("v2", "v1", None)
    assert loop.judge.watch is not None and loop.judge.watch.version == "v2"
    loop.act(20.0, "rollback", Verdict("retire", "guardrail", "rule", {}))
    assert (loop.champion, loop.previous) == ("v1", None)
    assert [(e.kind, e.version, e.champion) for e in loop.events] == [
        ("promote", "v2", "v2"),
        ("rollback", "v2", "v1"),
    ]


def test_the_old_champion_serves_the_holdback_slice_until_the_guardrail_clears(
    champion: GNNScheduler,
) -> None:
    loop = SimLoop(champion, LoopConfig(share=0.3, holdback_share=0.2))
    ids = [f"wf-{i:07d}" for i in range(400)]
    loop.versions["v2"] = champion
    loop.parent["v2"] = "v1"
    loop.challenger = "v2"
    loop.judge.versions("v1", "v2")
    assert "holdback" not in {loop.arm_of(i) for i in ids}  # nothing held back yet
    loop.act(10.0, "promote", Verdict("promote", "better", "rule", {}))
    held = [i for i in ids if loop.arm_of(i) == "holdback"]
    assert held == [i for i in ids if 0.3 <= workflow_bucket(i) < 0.5]
    assert loop._server("holdback")[0] == "v1" and loop._server("champion")[0] == "v2"
    loop.act(20.0, "clear", Verdict("promote", "guardrail: no worse", "rule", {}))
    assert loop.holdback is None and loop.champion == "v2"
    assert "holdback" not in {loop.arm_of(i) for i in ids}
    assert [(e.kind, e.version) for e in loop.events] == [("promote", "v2"), ("clear", "v2")]


def test_the_exploration_slice_samples_feeds_the_learner_and_is_not_judged(
    champion: GNNScheduler,
) -> None:
    sc = _scenario(16)
    loop = SimLoop(champion, LoopConfig(share=0.2, explore_share=0.4, every_n=10**9), seed=3)
    judged: list[str] = []
    add = loop.judge.add

    def recorded(s: Sample) -> Any:
        judged.append(s.arm)
        return add(s)

    loop.judge.add = recorded  # type: ignore[method-assign]
    loop.run(loop.simulator(sc, generate_workflows(sc, 3), 3))
    ids = {w.workflow_id for w in loop.workflows.values()}
    explored = {i for i in ids if 0.2 <= workflow_bucket(i) < 0.6}
    assert explored and explored != ids
    assert all((j.arm == "explore") == (j.workflow_id in explored) for j in loop.window)
    assert any(j.arm == "explore" for j in loop.window)
    assert not loop._explorers["v1"].deterministic  # the champion, sampling
    assert judged and "explore" not in judged  # outcomes judged: the champion's only


def test_keep_learning_trains_shadows_during_a_test_and_tests_the_latest_next(
    champion: GNNScheduler,
) -> None:
    # no verdict within the run: the first challenger stays under test while shadows follow
    ev = LoopConfig().evaluator.model_copy(update={"min_samples": 10**6})
    cfg = LoopConfig(
        share=0.3,
        explore_share=0.4,
        every_n=40,
        finetune=FAST,
        evaluator=ev,
        keep_learning=True,
        learner="ppo",
    )
    loop, _ = _run(champion, cfg)
    rounds = [e for e in loop.events if e.kind == "round"]
    assert len(rounds) >= 3 and loop.challenger == "v2"
    assert not rounds[0].detail.get("shadow") and all(e.detail["shadow"] for e in rounds[1:])
    # each shadow starts from the one before (learning carries on), the first from the challenger
    assert [e.detail["from"] for e in rounds[1:]] == [e.version for e in rounds[:-1]]
    assert loop.shadow == rounds[-1].version
    assert loop._server("explore")[0] == loop.shadow  # the shadow explores, on-policy
    assert loop._server("challenger")[0] == "v2"
    # the test ends: the latest shadow is the next challenger at once
    loop.act(99.0, "retire", Verdict("retire", "futile", "rule", {}))
    assert loop.challenger == rounds[-1].version and loop.shadow is None
    assert [e.kind for e in loop.events[-2:]] == ["retire", "challenger"]


def _sabotaged(champion: GNNScheduler) -> GNNScheduler:
    """The champion with its memory and CPU means at their floors: OOM kills, slow tasks."""
    model = copy.deepcopy(champion.model)
    with torch.no_grad():
        model.cont_head[-1].bias[0] -= 12.0
        model.cont_head[-1].bias[2] -= 12.0
    return GNNScheduler(model, champion.normalizer, "bad")


def test_a_bad_version_promoted_by_hand_is_rolled_back_by_the_guardrail(
    champion: GNNScheduler,
) -> None:
    """`promote_by_hand` (the bench's `dagsched models promote`): a sabotaged version is rolled
    back within the guardrail's window and the champion serves again. (The guardrail compares
    the new champion's SLA after the promotion with the old one's before it; as the cluster
    fills, that also rolls back a copy of the champion in some runs: docs/concepts/learning.md,
    "What has been measured".)"""
    sc = replace(_scenario(120), drift=None)
    window = 60
    ev = EvaluatorSettings(guardrail_window=window)
    loop = SimLoop(champion, LoopConfig(every_n=10**9, share=0.0, evaluator=ev), seed=5)
    sim = loop.simulator(sc, generate_workflows(sc, 5), 5)
    loop.run(sim, until=sorted(w.arrival_s for w in generate_workflows(sc, 5))[20])
    version = loop.promote_by_hand(_sabotaged(champion), sim.now)
    assert (loop.champion, loop.previous) == (version, "v1")
    results = loop.run(sim)
    assert [w for w in results if w.version == version]  # it served before any verdict
    assert [(e.kind, e.version) for e in loop.events] == [
        ("promote", version),
        ("rollback", version),
    ]
    assert (loop.champion, loop.previous) == ("v1", None)
    rollback = loop.events[-1].detail
    assert rollback["reason"].startswith(f"guardrail: SLA of {version}")
    assert rollback["stats"]["sla"]["n_challenger"] <= window
    assert results[-1].version == "v1"  # the champion serves again


def _replaying(champion: GNNScheduler, challenger: GNNScheduler) -> SimLoop:
    """A loop judged by the replay judge in small windows, `challenger` under test as v2."""
    replay = EvaluatorSettings().replay.model_copy(update={
        "window_workflows": 15, "warmup_workflows": 10, "replays": 2, "min_replays": 4,
        "fidelity_max_jct_err": 10.0,
    })  # fmt: skip
    canary = EvaluatorSettings().canary.model_copy(update={"min_workflows": 5})
    ev = EvaluatorSettings(judge="replay", replay=replay, canary=canary)
    served = GNNScheduler(champion.model, champion.normalizer, "v1")
    loop = SimLoop(served, LoopConfig(share=0.3, every_n=10**9, evaluator=ev), seed=5)
    loop.versions["v2"] = GNNScheduler(challenger.model, challenger.normalizer, "v2")
    loop.parent["v2"] = "v1"
    loop.challenger = "v2"
    loop.judge.versions("v1", "v2")
    return loop


def test_the_replay_judge_promotes_a_better_challenger_once_its_canary_is_clean(
    champion: GNNScheduler,
) -> None:
    sc = replace(_scenario(90), drift=None)
    loop = _replaying(_sabotaged(champion), champion)
    with pytest.raises(ValueError, match=r"SimLoop\.simulator"):
        loop.run(Simulator(sc, generate_workflows(sc, 5), seed=5))  # arrivals not recorded
    loop.run(loop.simulator(sc, generate_workflows(sc, 5), 5))
    assert loop.windows and all(w["challenger"] == "v2" for w in loop.windows[:1])
    promote = next(e for e in loop.events if e.kind == "promote")
    assert promote.version == "v2" and promote.detail["reason"].startswith("replay: ")
    assert "canary" in promote.detail["reason"]
    judged = [w for w in loop.windows if w["at_s"] <= promote.at_s]
    assert judged[-1]["decision"] == "promote"  # the win came from a judged window


def test_the_replay_judge_retires_a_worse_challenger(champion: GNNScheduler) -> None:
    sc = replace(_scenario(90), drift=None)
    loop = _replaying(champion, _sabotaged(champion))
    loop.run(loop.simulator(sc, generate_workflows(sc, 5), 5))
    assert not [e for e in loop.events if e.kind == "promote"] and loop.champion == "v1"
    retire = next(e for e in loop.events if e.kind == "retire")
    assert retire.version == "v2" and loop.challenger is None
