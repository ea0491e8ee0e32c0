"""The A/B loop through the real services: a replay through the broker, a daemon serving both
arms from the MLflow registry, and the evaluator service judging them from Kafka."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path
from typing import Any

import torch

from dagsched.daemon.replay import Replay, ReplayConfig
from dagsched.learner.live_ab import Sample
from dagsched.learner.services import EvaluatorService
from dagsched.policy.bundle import load_bundle, save_bundle
from dagsched.policy.model import ActorCritic
from dagsched.registry.promotion import Promoter, audit_trail
from dagsched.registry.store import CHALLENGER, CHAMPION, HOLDBACK, SHIPPED_CHAMPION, Registry
from dagsched.settings import Settings
from tests.daemon.conftest import register_version, wait_for

WORKFLOWS = 120
# A batch whose view lags the event that made its task ready waits up to `view_wait_ms` (250 ms
# by default) for the updater. Here the verdicts are the subject, not the freshness of views
# (tests/daemon/test_freshness.py): give up after a few fetch waits.
VIEW_WAIT_MS = 30.0


def _fast_views(settings: Settings, **daemon: Any) -> dict[str, Any]:
    return {"daemon": settings.daemon.model_copy(update={"view_wait_ms": VIEW_WAIT_MS, **daemon})}


def _ab_settings(settings: Settings, **evaluator: Any) -> Settings:
    return settings.model_copy(
        update={
            **_fast_views(settings, challenger_share=0.5),
            "evaluator": settings.evaluator.model_copy(
                update={"judge": "ab", "min_samples": 10, **evaluator}
            ),
        }
    )


async def _ab(
    s: Settings, champion: ActorCritic, challenger: ActorCritic, start_daemon: Any,
    workflows: int = WORKFLOWS,
) -> tuple[list[dict[str, Any]], Registry, str, str, Any]:  # fmt: skip
    """Register both (in a store that already holds the shipped champion), serve both,
    replay, and return the evaluator's verdicts."""
    shipped = load_bundle(SHIPPED_CHAMPION, "shipped")
    reg = Registry(s)

    def register(model: ActorCritic, name: str) -> str:
        folder = Path(s.home) / name
        save_bundle(folder, model, shipped.normalizer)
        with reg.run(name, {}) as run:
            return reg.register_bundle(folder, run.run_id, metrics={}, parent=None, data=name)

    v1 = await asyncio.to_thread(register, champion, "a")
    v2 = await asyncio.to_thread(register, challenger, "b")
    await asyncio.to_thread(reg.set_alias, CHAMPION, v1)
    await asyncio.to_thread(reg.set_alias, CHALLENGER, v2)
    verdicts: list[dict[str, Any]] = []
    stop = asyncio.Event()
    evaluator = EvaluatorService(s, verdicts.append)
    judged = asyncio.create_task(evaluator.run(stop))
    daemon = await start_daemon(s, registry=True)
    await daemon.until_serving("champion", f"v{v1}", timeout=60)
    await daemon.until_serving("challenger", f"v{v2}", timeout=60)
    enough = asyncio.Event()  # the replay stops at the first verdict
    replay = asyncio.create_task(Replay(s, ReplayConfig(workflows=workflows, seed=3)).run(enough))
    try:
        await wait_for(lambda: verdicts or replay.done(), 300, "a verdict or the replay's end")
        enough.set()
        await replay
        await wait_for(lambda: verdicts, 60, "a verdict")
    finally:
        stop.set()
        await asyncio.wait_for(judged, 30)
    return verdicts, reg, v1, v2, daemon


async def test_a_a_is_not_promoted_within_its_budget(
    settings: Settings, champion: Registry, start_daemon
):
    s = _ab_settings(settings, max_samples=30)
    same = load_bundle(SHIPPED_CHAMPION, "shipped").model
    verdicts, reg, v1, v2, _ = await _ab(s, same, same, start_daemon)
    assert verdicts[0]["version"] == v2
    assert [v["action"] for v in verdicts] == ["retire"]  # budget, futility or "worse"
    assert reg.alias_version(CHAMPION) == v1 and reg.alias_version(CHALLENGER) is None
    # each workflow's covariates came from the decision log (its first batch's view), so the
    # test can run regression-adjusted
    assert "adjusted on log_slack" in verdicts[0]["rule"]
    judged = verdicts[0]["workflows_judged"]
    assert judged > 0 and verdicts[0]["workflows_with_covariates"] >= 0.9 * judged


async def test_trained_challenger_beats_a_bad_champion(
    settings: Settings, champion: Registry, start_daemon
):
    # (an untrained network is not reliably bad: its reservations are centred on the
    # predicted demand, and at the test profile's light load its random nodes cost ~0.1
    # reward per workflow, which ~60 workflows per arm may not resolve)
    s = _ab_settings(settings)
    trained = load_bundle(SHIPPED_CHAMPION, "shipped").model
    verdicts, reg, _v1, v2, daemon = await _ab(s, _sabotaged(), trained, start_daemon)
    assert verdicts[0]["action"] == "promote" and verdicts[0]["version"] == v2
    assert reg.alias_version(CHAMPION) == v2
    await daemon.until_serving("champion", f"v{v2}")  # the notice reached the daemon


async def test_the_replay_judge_promotes_once_the_canary_is_clean(
    settings: Settings, champion: Registry, start_daemon
):
    ev = settings.evaluator
    s = settings.model_copy(
        update={
            **_fast_views(settings, challenger_share=0.5),
            "evaluator": ev.model_copy(
                update={
                    "judge": "replay",
                    "canary": ev.canary.model_copy(update={"min_workflows": 10}),
                    # windows of 20 arrivals, 4 replays each: two windows reach min_replays.
                    # Half of each window was served by the challenger, so the champion's
                    # replays cannot predict it: fidelity is recorded, not gated, here
                    "replay": ev.replay.model_copy(
                        update={
                            "window_workflows": 20,
                            "warmup_workflows": 10,
                            "replays": 4,
                            "min_replays": 8,
                            "fidelity_max_jct_err": 100.0,
                        }
                    ),
                }
            ),
        }
    )
    trained = load_bundle(SHIPPED_CHAMPION, "shipped").model
    verdicts, reg, v1, v2, daemon = await _ab(s, _sabotaged(), trained, start_daemon, 200)
    first = verdicts[0]
    assert first["action"] == "promote" and first["version"] == v2, first
    assert first["judge"] == "replay" and first["reason"].startswith("replay: challenger better")
    assert "canary clean" in first["reason"]
    replay, canary = first["replay"], first["canary"]
    assert replay["decision"] == "promote"
    # the metrics the verdict names are the ones whose interval clears zero (which of JCT,
    # SLA and reward gets there first on two small windows varies run to run)
    named = replay["reason"].removeprefix("challenger better on ").split(", ")
    assert named and all(replay["stats"][m]["lower"] > 0 for m in named), replay
    assert replay["fidelity"]["observed_jct_s"] > 0 and replay["fidelity"]["predicted_jct_s"] > 0
    assert canary["status"] == "clean" and canary["workflows"] >= 10
    assert reg.alias_version(CHAMPION) == v2
    (audit,) = [a for a in audit_trail(reg, v2) if a["action"] == "promote"]
    path = reg.client.download_artifacts(audit["run_id"], "audit.json")
    kept = json.loads(Path(path).read_text())
    assert kept["stats"]["replay"]["fidelity"] == replay["fidelity"]  # the audit keeps the verdict
    await daemon.until_serving("champion", f"v{v2}")
    # the old champion serves the holdback slice while the guardrail watches the new one
    assert reg.alias_version(HOLDBACK) == v1
    await daemon.until_serving("holdback", f"v{v1}")


async def test_a_guardrail_that_clears_ends_the_holdback(settings: Settings, champion: Registry):
    s = settings.model_copy(
        update={"evaluator": settings.evaluator.model_copy(update={"guardrail_window": 20})}
    )
    reg = champion
    v1 = reg.alias_version(CHAMPION)
    v2 = await asyncio.to_thread(register_version, reg, "the new champion")
    await asyncio.to_thread(Promoter(reg).promote, v2, "by hand", "tester", None, True)
    verdicts: list[dict[str, Any]] = []
    evaluator = EvaluatorService(s, verdicts.append)
    evaluator.judge.versions(f"v{v1}", None)
    evaluator.judge.versions(f"v{v2}", None, previous=f"v{v1}", holdback=f"v{v1}")
    held = [Sample(f"h{i}", "holdback", f"v{v1}", 1.0, 0.0, 0.5) for i in range(10)]
    new = [Sample(f"c{i}", "champion", f"v{v2}", 1.0, 0.0, 0.5) for i in range(20)]
    assert not any(evaluator.judge.add(x) for x in held + new[:-1])
    action = evaluator.judge.add(new[-1])
    assert action is not None and action[0] == "clear"
    await asyncio.to_thread(evaluator._act, *action)
    assert [(v["action"], v["version"]) for v in verdicts] == [("clear", v2)]
    assert "error" not in verdicts[0] and "holdback slice" in verdicts[0]["reason"]
    assert reg.alias_version(HOLDBACK) is None and reg.alias_version(CHAMPION) == v2
    assert [a["action"] for a in audit_trail(reg, v2)] == ["promote", "clear"]


def _sabotaged() -> ActorCritic:
    """A deliberately bad challenger: the shipped champion with its continuous head pushed
    to the floor of every value (CPU 0.1 and memory 0.2 of the node, one retry), so tasks
    OOM, get throttled and run out of retries."""
    model = copy.deepcopy(load_bundle(SHIPPED_CHAMPION, "shipped").model)
    last = model.cont_head[-1]
    assert isinstance(last, torch.nn.Linear)
    with torch.no_grad():
        last.bias[0::2] = -12.0  # the shift of each Beta mean in logit space
    return model


async def test_guardrail_rolls_back_a_bad_version_promoted_by_hand(
    settings: Settings, champion: Registry, start_daemon
):
    s = settings.model_copy(
        update={
            **_fast_views(settings),
            "evaluator": settings.evaluator.model_copy(update={"guardrail_window": 80}),
        }
    )
    shipped = load_bundle(SHIPPED_CHAMPION, "shipped")
    folder = Path(s.home) / "bad"
    save_bundle(folder, _sabotaged(), shipped.normalizer)
    reg = champion
    with reg.run("bad", {}) as run:
        bad = reg.register_bundle(folder, run.run_id, metrics={}, parent="1", data="sabotaged")
    good = reg.alias_version(CHAMPION)
    verdicts: list[dict[str, Any]] = []
    stop = asyncio.Event()
    evaluator = EvaluatorService(s, verdicts.append)
    judged = asyncio.create_task(evaluator.run(stop))
    daemon = await start_daemon(s, registry=True)
    await daemon.until_serving("champion", f"v{good}", timeout=60)
    enough = asyncio.Event()
    replay = asyncio.create_task(Replay(s, ReplayConfig(workflows=300, seed=5)).run(enough))
    try:
        # the good champion serves first, so the guardrail has a baseline
        await wait_for(lambda: evaluator.samples >= 40, 300, "40 workflows of the champion")
        await asyncio.to_thread(Promoter(reg).promote, bad, "hand-checked", "tester")
        await daemon.until_serving("champion", f"v{bad}", timeout=30)
        await wait_for(lambda: verdicts or replay.done(), 300, "a verdict or the replay's end")
        enough.set()
        await replay
        await wait_for(lambda: verdicts, 60, "the guardrail's verdict")
    finally:
        stop.set()
        await asyncio.wait_for(judged, 30)
    assert [v["action"] for v in verdicts] == ["rollback"], verdicts
    assert "guardrail" in verdicts[0]["reason"] and "error" not in verdicts[0]
    assert reg.alias_version(CHAMPION) == good
    assert reg.client.get_model_version(reg.name, bad).tags.get("rolled_back") == "true"
    trail = audit_trail(reg, bad)
    assert [a["action"] for a in trail] == ["promote", "rollback"]
    assert trail[0]["actor"] == "tester"
    assert trail[1]["actor"].startswith("evaluator:") and "guardrail" in trail[1]["reason"]
    await daemon.until_serving("champion", f"v{good}")  # the daemons follow the rollback
