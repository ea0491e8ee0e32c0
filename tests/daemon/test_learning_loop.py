"""The learner and promotions against the real broker, Redis and an MLflow SQLite store."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis

from dagsched.daemon.broker import ensure_topics
from dagsched.learner.curriculum import Curriculum
from dagsched.learner.head_search import with_shifts
from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import TrafficRecorder, config_from
from dagsched.learner.services import LearnerService
from dagsched.learner.train import demonstrations
from dagsched.policy.bundle import save_bundle
from dagsched.registry.promotion import Promoter
from dagsched.registry.serving import model_channel
from dagsched.registry.store import CHALLENGER, CHAMPION, PREVIOUS, Registry
from dagsched.settings import Settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from tests.conftest import clone_mlflow_home
from tests.daemon.conftest import Client, make_settings, wait_for
from tests.daemon.learner_feed import publish_decided


async def test_learner_registers_a_challenger_from_the_logs(
    broker, redis_url, tmp_path: Path, champion_template: Path
):
    s: Settings = make_settings(
        broker.bootstrap,
        redis_url,
        tmp_path,
        **{"learner.method": "ppo", "learner.every_n_tasks": 40},
    )
    await ensure_topics(s)
    clone_mlflow_home(champion_template, s.home)
    reg = Registry(s)
    champion = await asyncio.to_thread(reg.ensure_champion)
    obs, nodes, units = demonstrations(
        Curriculum(ScenarioConfig(), workflows_per_episode=2), 1, "heft", seed=2
    )
    await publish_decided(s, (obs, nodes, units), str(champion))

    learner = LearnerService(s)
    stop = asyncio.Event()
    task = asyncio.create_task(learner.run(stop))
    try:
        await wait_for(lambda: learner.rounds or task.done(), 90, "a fine-tuning round")
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
    (version,) = learner.rounds
    assert reg.alias_version(CHALLENGER) == version and reg.alias_version(CHAMPION) == champion
    tags = reg.client.get_model_version(reg.name, version).tags
    assert tags["parent"] == champion and tags["origin"] == "online-learner"
    assert tags["data"].startswith("online window: 50 transitions")
    assert "metric.losses/grad_norm" in tags and tags["resumed_from"] == ""
    reg.load(version)  # a servable, verified bundle

    # one challenger under test at a time, unless told to replace it
    restarted = LearnerService(s)
    assert restarted.challenger_busy()
    replacing = s.model_copy(
        update={"learner": s.learner.model_copy(update={"replace_challenger": True})}
    )
    assert not LearnerService(replacing).challenger_busy()
    # a restarted learner carries on from the latest challenger, not from the champion
    restarted.window.extend(learner.window)
    notices = aioredis.from_url(redis_url).pubsub()
    await notices.subscribe(model_channel(s))
    again = await asyncio.to_thread(restarted.round)
    # the daemons are told at once (they would otherwise wait for their next poll)
    notice = None
    deadline = time.monotonic() + 10
    while notice is None and time.monotonic() < deadline:
        notice = await notices.get_message(ignore_subscribe_messages=True, timeout=1.0)
    await notices.aclose()
    assert notice is not None
    assert json.loads(notice["data"]) == {
        "action": "register",
        "alias": CHALLENGER,
        "version": again,
    }
    tags = reg.client.get_model_version(reg.name, again).tags
    assert tags["parent"] == champion and tags["resumed_from"] == version
    assert reg.alias_version(CHALLENGER) == again
    # once the challenger is promoted, its lineage ends: the next round starts from it as champion
    await asyncio.to_thread(Promoter(reg).promote, again, "test", "tester")
    assert restarted.resume_point(again) is None
    assert not restarted.challenger_busy()  # promotion freed the challenger slot


async def test_daemons_follow_a_promotion_and_a_rollback(
    settings: Settings, champion: Registry, client: Client, start_daemon, normalizer
):
    from dagsched.policy.bundle import save_bundle
    from dagsched.policy.model import ActorCritic

    reg = champion
    v1 = await asyncio.to_thread(reg.ensure_champion)
    folder = settings.home / "b2"
    save_bundle(folder, ActorCritic().eval(), normalizer)
    with reg.run("t", {}) as run:
        v2 = reg.register_bundle(folder, run.run_id, metrics={}, parent=v1, data="t")
    await client.heartbeats(4)
    daemons = [await start_daemon(registry=True) for _ in range(2)]
    for d in daemons:
        await d.until_serving("champion", f"v{v1}")

    async def switch(action: str, want: str) -> float:
        """Seconds from the alias move until every daemon serves `want` (per /healthz)."""
        p = Promoter(reg)
        if action == "promote":
            await asyncio.to_thread(p.promote, v2, "test", "tester")
        else:
            await asyncio.to_thread(p.rollback, "test", "tester")
        moved = time.monotonic()

        async def everywhere() -> bool:
            return all([await d.serves("champion", want) for d in daemons])

        await wait_for(everywhere, 30, f"daemons to serve {want}")
        return time.monotonic() - moved

    assert await switch("promote", f"v{v2}") < 10
    assert reg.aliases() == {CHAMPION: v2, PREVIOUS: v1}
    await client.workflow("wf-a", n_tasks=2)
    await client.ready("wf-a", 0)
    (d1,) = await client.wait("decisions", 1)
    assert d1.model_version == f"v{v2}" and d1.arm == "champion"
    assert await switch("rollback", f"v{v1}") < 10
    await client.ready("wf-a", 1)
    d2 = (await client.wait("decisions", 2))[1]
    assert d2.model_version == f"v{v1}"


def test_a_search_learner_registers_the_shifts_its_recorded_windows_favour(
    redis_url, tmp_path: Path, champion_template: Path
):
    """`learner.method: search`: a round searches the champion's heads' shifts on the
    windows the learner recorded and registers the move that shortened their replays (the
    champion here has its memory margin starved: most workflows run out of retries)."""
    s = _search_settings(redis_url, tmp_path)
    clone_mlflow_home(champion_template, s.home)
    reg = Registry(s)
    reg.ensure_champion()
    champion = _starved_champion(reg)
    learner = LearnerService(s)
    assert learner.gate is not None
    assert learner.round() is None  # nothing recorded yet: no round
    learner.gate.recent.extend(_recorded_windows(s, 40))
    version = learner.round()
    assert version is not None and reg.alias_version(CHALLENGER) == version
    tags = reg.client.get_model_version(reg.name, version).tags
    assert tags["method"] == "search" and tags["parent"] == champion
    assert tags["data"].startswith("replay search over recorded windows 0,1: shifts mem ")
    start, score = float(tags["metric.search/start_jct_s"]), float(tags["metric.search/jct_s"])
    assert score < start
    moved = float(tags["metric.search/shift_mem"])
    tuned, base = reg.load(version).model, reg.load(champion).model
    bias = tuned.cont_head[-1].bias.detach() - base.cont_head[-1].bias.detach()
    assert moved > 0 and float(bias[2]) == pytest.approx(moved)
    assert learner.round() is None  # the same windows, the same champion: searched already


def test_a_search_learner_replaces_a_challenger_its_fresher_windows_show_wrong(
    redis_url, tmp_path: Path, champion_template: Path
):
    """`learner.search.supersede`: with a challenger under test (one that starves memory
    further than its champion), a due round is not held back: it searches the windows
    closed since the challenger came, and registers the move it finds in its place, having
    beaten it there."""
    s = _search_settings(redis_url, tmp_path, **{"learner.search.supersede": True})
    clone_mlflow_home(champion_template, s.home)
    reg = Registry(s)
    reg.ensure_champion()
    champion = _starved_champion(reg)
    worse_model = with_shifts(reg.load(champion).model, {"mem": -1.0})
    worse = _registered(reg, worse_model, champion, champion, "by hand")
    reg.set_alias(CHALLENGER, worse)
    learner = LearnerService(s)
    assert learner.gate is not None
    assert not learner.challenger_busy() and learner.next_round() == CHALLENGER
    learner.gate.recent.extend(_recorded_windows(s, 40))
    version = learner.round()
    assert version is not None and version != worse
    assert reg.alias_version(CHALLENGER) == version
    tags = reg.client.get_model_version(reg.name, version).tags
    assert tags["parent"] == champion and f"replaces v{worse}" in tags["data"]
    assert float(tags["metric.search/jct_s"]) < float(tags["metric.search/rival_jct_s"])
    assert float(tags["metric.search/shift_mem"]) > 0


def _search_settings(redis_url: str, tmp_path: Path, **extra: Any) -> Settings:
    """`learner.method: search` over the memory shift alone, one step of 3 logit, on small
    windows."""
    return make_settings(
        "localhost:1", redis_url, tmp_path,
        **{
            "learner.method": "search",
            "learner.search.heads": ["mem"],
            "learner.search.step": 3.0, "learner.search.min_step": 3.0,
            "learner.search.max_evals": 3,
            "evaluator.replay.window_workflows": 20, "evaluator.replay.warmup_workflows": 10,
            **extra,
        },
    )  # fmt: skip


def _registered(reg: Registry, model: Any, of: str, parent: str | None, data: str) -> str:
    """`model`, with version `of`'s normalizer, registered with `parent`."""
    normalizer = reg.load(of).normalizer
    with tempfile.TemporaryDirectory() as tmp, reg.run(data, {}) as run:
        save_bundle(Path(tmp), model, normalizer)
        return reg.register_bundle(
            Path(tmp), run.run_id, metrics={}, parent=parent, data=data,
            first_is_champion=False,
        )  # fmt: skip


def _starved_champion(reg: Registry) -> str:
    """The shipped champion with its memory shift at -3 logit, registered as the champion."""
    shipped = reg.alias_version(CHAMPION) or ""
    starved = with_shifts(reg.load(shipped).model, {"mem": -3.0})
    version = _registered(reg, starved, shipped, None, "starved")
    reg.set_alias(CHAMPION, version)
    return version


def _recorded_windows(s: Settings, n: int) -> list[Any]:
    """The windows a run of `n` workflows of `s.sim` under heft_history closes."""
    rec = TrafficRecorder.of(config_from(s.evaluator.replay))
    return record_run(
        lambda wfs, hook: Simulator(s.sim, wfs, seed=4, on_outcome=hook),
        make_policy("heft_history", 4), rec, stream_workflows(s.sim, 4, n),
    )  # fmt: skip
