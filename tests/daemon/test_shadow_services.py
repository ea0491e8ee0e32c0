"""`learner.keep_learning`, `learner.min_rounds` and `learner.credit` in the real services
(the simulator loop's shadow, `dagsched.learner.sim_loop`): against the real broker, Redis
and an MLflow SQLite store. A due round during an A/B test improves `@shadow` instead of
waiting; the first challenger of a champion waits for `min_rounds` rounds on the shadow; the
evaluator makes the shadow the next challenger when a test ends; the daemons serve the
exploration slice from the shadow."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from dagsched.daemon.arms import workflow_bucket
from dagsched.daemon.broker import ensure_topics
from dagsched.learner.curriculum import Curriculum
from dagsched.learner.services import EvaluatorService, LearnerService
from dagsched.learner.train import demonstrations
from dagsched.registry.promotion import audit_trail
from dagsched.registry.store import (
    CHALLENGER,
    CHAMPION,
    HOLDBACK,
    PREVIOUS,
    SHADOW,
    SHIPPED_CHAMPION,
    Registry,
)
from dagsched.schemas.messages import (
    DecisionMsg,
    TaskFinishedMsg,
    TaskSpecMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.settings import Settings, SettingsError
from dagsched.sim.config import ScenarioConfig
from tests.conftest import clone_mlflow_home
from tests.daemon.conftest import Client, make_settings, register_version, wait_for
from tests.daemon.learner_feed import Demos, publish_decided

EVERY_N = 40  # learner.every_n_tasks: one round per 8 of the 5-task workflows below


@pytest.fixture(scope="module")
def demos() -> Demos:
    """Observations and the teacher's actions to log as decisions (one episode of HEFT)."""
    obs, nodes, units = demonstrations(
        Curriculum(ScenarioConfig(), workflows_per_episode=2), 1, "heft", seed=2
    )
    return list(obs), list(nodes), list(units)


async def _store(
    broker: Any, redis_url: str, tmp_path: Path, template: Path, **overrides: Any
) -> tuple[Settings, Registry, str]:
    """Settings with their own topics and MLflow store; the shipped champion's version."""
    s = make_settings(
        broker.bootstrap,
        redis_url,
        tmp_path,
        **{"learner.method": "ppo", "learner.every_n_tasks": EVERY_N, **overrides},
    )
    await ensure_topics(s)
    clone_mlflow_home(template, s.home)
    reg = Registry(s)
    champion = await asyncio.to_thread(reg.ensure_champion)
    assert champion is not None
    return s, reg, champion


def _learner(s: Settings, **learner: Any) -> LearnerService:
    return LearnerService(s.model_copy(update={"learner": s.learner.model_copy(update=learner)}))


@contextlib.asynccontextmanager
async def _running(service: Any) -> AsyncIterator[asyncio.Task[None]]:
    """The service's `run` as a task for the block; stopped (and its error raised) after."""
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    try:
        yield task
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)


def _tags(reg: Registry, version: str) -> dict[str, str]:
    return dict(reg.client.get_model_version(reg.name, version).tags)


def test_credit_reaches_the_rounds_and_is_validated(tmp_path: Path) -> None:
    s = make_settings("localhost:1", "redis://localhost:1", tmp_path)
    assert LearnerService(s).finetune_config().credit == "task"  # FinetuneConfig's default
    assert _learner(s, credit="task-critic").finetune_config().credit == "task-critic"
    with pytest.raises(SettingsError, match="learner\\."):
        make_settings("localhost:1", "redis://localhost:1", tmp_path, **{"learner.credit": "x"})
    with pytest.raises(SettingsError, match="learner\\."):
        make_settings("localhost:1", "redis://localhost:1", tmp_path, **{"learner.min_rounds": 0})


async def test_a_due_round_improves_the_shadow_while_a_challenger_is_under_test(
    broker, redis_url, tmp_path: Path, champion_template: Path, demos: Demos
):
    s, reg, champion = await _store(broker, redis_url, tmp_path, champion_template)
    chall = await asyncio.to_thread(register_version, reg, "under A/B test")
    await asyncio.to_thread(reg.set_alias, CHALLENGER, chall)
    await publish_decided(s, demos, champion)

    # keep_learning off (the default): the due round waits for the verdict
    waiting = _learner(s, group_id="waiting")
    async with _running(waiting) as task:
        await wait_for(lambda: waiting.waited or task.done(), 60, "the due round to wait")
    assert waiting.completed >= EVERY_N and waiting.rounds == []
    assert reg.aliases() == {CHAMPION: champion, CHALLENGER: chall}

    # on: the same due round registers a shadow; the challenger under test is untouched
    learner = _learner(s, group_id="keeping", keep_learning=True)
    async with _running(learner) as task:
        await wait_for(lambda: learner.rounds or task.done(), 90, "a round on the shadow")
    (shadow,) = learner.rounds
    assert learner.aliases == [SHADOW] and learner.waited == 0
    assert reg.aliases() == {CHAMPION: champion, CHALLENGER: chall, SHADOW: shadow}
    tags = _tags(reg, shadow)
    # chained from the challenger of the champion's lineage
    assert tags["parent"] == champion and tags["resumed_from"] == chall
    assert tags["registered_as"] == SHADOW and tags["credit"] == "task"
    reg.load(shadow)  # a servable, verified bundle
    # the next round chains on the shadow, not on the challenger
    assert await asyncio.to_thread(learner.next_round) == SHADOW
    again = await asyncio.to_thread(learner.round, SHADOW)
    assert _tags(reg, again)["resumed_from"] == shadow
    assert reg.aliases() == {CHAMPION: champion, CHALLENGER: chall, SHADOW: again}
    # a shadow round during which the test ended (no shadow was there to be tested next):
    # proposed as the challenger at once, chained from the shadow it supersedes
    assert await asyncio.to_thread(learner.next_round) == SHADOW
    await asyncio.to_thread(reg.delete_alias, CHALLENGER)
    third = await asyncio.to_thread(learner.round, SHADOW)
    assert reg.aliases() == {CHAMPION: champion, CHALLENGER: third}
    assert _tags(reg, third)["resumed_from"] == again


async def test_min_rounds_chains_shadows_before_the_first_challenger(
    broker, redis_url, tmp_path: Path, champion_template: Path, demos: Demos
):
    s, reg, champion = await _store(
        broker,
        redis_url,
        tmp_path,
        champion_template,
        **{
            "learner.keep_learning": True,
            "learner.min_rounds": 2,
            "learner.credit": "task-critic",
        },
    )
    await publish_decided(s, demos, champion)
    learner = LearnerService(s)
    async with _running(learner) as task:
        await wait_for(lambda: learner.rounds or task.done(), 90, "the first round")
        (first,) = learner.rounds
        # no challenger under test, yet the first round goes to the shadow
        assert learner.aliases == [SHADOW]
        assert reg.aliases() == {CHAMPION: champion, SHADOW: first}
        assert _tags(reg, first)["resumed_from"] == ""
        await publish_decided(s, demos, champion, first=10)
        await wait_for(lambda: len(learner.rounds) > 1 or task.done(), 90, "the second round")
    second = learner.rounds[1]
    assert learner.aliases == [SHADOW, CHALLENGER]
    # the second is the champion's first challenger, chained from the shadow it supersedes
    assert reg.aliases() == {CHAMPION: champion, CHALLENGER: second}
    tags = _tags(reg, second)
    assert tags["parent"] == champion and tags["resumed_from"] == first
    assert tags["credit"] == "task-critic"
    assert learner.rounds_for(champion) == 2


async def _publish_outcomes(
    s: Settings, arm: str, version: str, first: int, n: int, end_at: float
) -> None:
    """`n` one-task workflows decided by `arm`/`version`, finished at `end_at` (deadline 30)."""
    client = await Client(s).start()
    try:
        spec = TaskSpecMsg(name="t", type="cpu", duration_s=10, cpu_cores=2, mem_gb=4)
        for w in range(first, first + n):
            wf = f"wf-{w}"
            msg = WorkflowMsg(workflow_id=wf, tasks=[spec], edges=[], deadline_s=30)
            await client.send("tasks", msg.encode(), wf)
            common = {"workflow_id": wf, "task": 0, "attempt": 0}
            dec = DecisionMsg(
                **common, node="node-0000", cpu=0.2, mem=0.3, max_retries=3,
                model_version=f"v{version}", arm=arm, log_prob=-1.0,
                decided_at=time.time(), latency_ms=1.0,
            )  # fmt: skip
            await client.send("decisions", dec.encode(), wf)
            started = TaskStartedMsg(**common, node="node-0000", at=0.0)
            await client.send("events", started.encode(), "node-0000")
            done = TaskFinishedMsg(**common, node="node-0000", at=end_at)
            await client.send("events", done.encode(), "node-0000")
    finally:
        await client.close()


@pytest.mark.parametrize("verdict", ["retire", "promote"])
async def test_the_shadow_is_the_next_challenger_when_a_test_ends(
    broker, redis_url, tmp_path: Path, champion_template: Path, verdict: str
):
    s, reg, champion = await _store(
        broker, redis_url, tmp_path, champion_template,
        **{"evaluator.min_samples": 10, "evaluator.judge": "ab"},
    )  # fmt: skip
    chall = await asyncio.to_thread(register_version, reg, "under A/B test")
    shadow = await asyncio.to_thread(register_version, reg, "the learner's shadow")
    await asyncio.to_thread(reg.set_alias, CHALLENGER, chall)
    await asyncio.to_thread(reg.set_alias, SHADOW, shadow)
    # ten workflows per arm: the challenger's all late (retire) or all early (promote)
    await _publish_outcomes(s, "champion", champion, 0, 10, end_at=20.0)
    await _publish_outcomes(s, "challenger", chall, 10, 10, 5.0 if verdict == "promote" else 60.0)
    verdicts: list[dict[str, Any]] = []
    evaluator = EvaluatorService(s, verdicts.append)
    async with _running(evaluator) as task:
        await wait_for(lambda: verdicts or task.done(), 60, "a verdict")
        await wait_for(lambda: evaluator.judge.challenger == f"v{shadow}", 30, "a new test")
    (record,) = verdicts
    assert record["action"] == verdict and record["version"] == chall, record
    assert "error" not in record and record["next_challenger"] == shadow
    trail = audit_trail(reg, shadow)
    assert [(a["action"], a["actor"]) for a in trail] == [("challenger", evaluator.actor)]
    if verdict == "retire":
        assert reg.aliases() == {CHAMPION: champion, CHALLENGER: shadow}
        assert _tags(reg, shadow)["parent"] == champion
        return
    # the old champion serves the holdback slice while the guardrail watches the new one
    assert reg.aliases() == {
        CHAMPION: chall, PREVIOUS: champion, CHALLENGER: shadow, HOLDBACK: champion
    }  # fmt: skip
    # re-parented onto the new champion: the learner goes on from it, daemons may serve it
    tags = _tags(reg, shadow)
    assert tags["parent"] == chall and tags["reparented_from"] == champion
    start = await asyncio.to_thread(LearnerService(s).resume_point, chall)
    assert start is not None and start.version == f"v{shadow}"
    assert LearnerService(s).rounds_for(chall) == 0  # made before chall was the champion


async def test_the_exploration_slice_samples_the_shadow_of_the_champion(
    broker, redis_url, tmp_path: Path, champion_template: Path, start_daemon
):
    s, reg, champion = await _store(
        broker,
        redis_url,
        tmp_path,
        champion_template,
        **{"daemon.challenger_share": 0.0, "daemon.explore_share": 0.5},
    )
    shadow = await asyncio.to_thread(register_version, reg, "the learner's shadow")
    with reg.run("stale", {}) as run:  # a shadow of another champion's lineage
        stale = reg.register_bundle(
            SHIPPED_CHAMPION, run.run_id, metrics={}, parent=shadow, data="stale"
        )
    client = await Client(s).start()
    try:
        await client.heartbeats(4)
        d = await start_daemon(s, registry=True)
        await d.until_serving("champion", f"v{champion}")
        # the alias moves while the daemon runs: the registry watch loads it
        await asyncio.to_thread(reg.set_alias, SHADOW, shadow)
        await d.until_serving("shadow", f"v{shadow}")
        n_wf, sent = 12, 0

        async def decide(prefix: str) -> dict[str, set[str]]:
            nonlocal sent
            for i in range(n_wf):
                await client.workflow(f"{prefix}-{i}", n_tasks=2)
                for t in range(2):
                    await client.ready(f"{prefix}-{i}", t)
            sent += 2 * n_wf
            got = await client.wait("decisions", sent, timeout=60)
            served: dict[str, set[str]] = {}
            for x in got:
                if x.workflow_id.startswith(prefix + "-"):
                    assert (x.arm == "explore") == (workflow_bucket(x.workflow_id) < 0.5)
                    served.setdefault(x.arm, set()).add(x.model_version)
            return served

        served = await decide("a")
        assert served == {"explore": {f"v{shadow}"}, "champion": {f"v{champion}"}}
        # a shadow whose parent is not the serving champion is not served
        await asyncio.to_thread(reg.set_alias, SHADOW, stale)
        await d.until_serving("shadow", f"v{stale}")
        served = await decide("b")
        assert served == {"explore": {f"v{champion}"}, "champion": {f"v{champion}"}}
        m = await d.metrics()
        assert m.value("dagsched_model_info", arm="shadow", version=f"v{stale}") == 1
        # the alias removed: the shadow arm serves nothing, and the gauge says so
        await asyncio.to_thread(reg.delete_alias, SHADOW)
        await d.until_serving("shadow", None)
        m = await d.metrics()
        assert m.value("dagsched_model_info", arm="shadow", version=f"v{stale}") == 0
    finally:
        await client.close()
