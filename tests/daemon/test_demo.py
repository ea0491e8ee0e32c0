"""`dagsched demo`'s whole loop: its own broker, the given Redis, a fresh demo registry."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

from dagsched.demo import TimeStandsStill, arrival_at, run_demo
from tests.daemon.conftest import make_settings


async def test_demo_runs_the_loop_and_tells_what_happened(redis_url: str, tmp_path: Path):
    s = make_settings(
        "127.0.0.1:1",  # unused: the demo starts its own broker
        redis_url,
        tmp_path,
        **{
            # ten workflows close no replay window: PPO rounds on the logs make the challengers
            "learner.method": "ppo",
            "learner.every_n_tasks": 40,
            "learner.outcome_timeout_s": 30.0,
            "daemon.challenger_share": 0.5,
            "evaluator.min_samples": 4,
            # a batch whose view lags gives up waiting soon: the story is the subject here,
            # not fresh views (tests/daemon/test_freshness.py)
            "daemon.view_wait_ms": 30.0,
        },
    )
    story = await run_demo(s, workflows=10, seed=1, shift_share=0.3, wait_for_loop=True)
    assert story.served_by == "v1"  # the shipped champion, registered in the demo registry
    assert story.settings["home"] == str(tmp_path / "demo")
    assert story.shift_at_s == arrival_at(s, 10, 1, 0.3)  # the fourth arrival
    outcomes = story.outcomes
    assert len(outcomes) == 10  # every replayed workflow is accounted for (ended or failed)
    assert story.replay["workflows_failed"] + sum(o.end_s is not None for o in outcomes) == 10
    assert sum(o.arrival_s < story.shift_at_s for o in outcomes) == 3
    assert story.replay["duplicates"] == 0
    # the learner made at least one challenger, a head-only shadow of v1
    assert story.rounds
    # simulated time stood still while a round ran
    assert story.replay["held_s"] > 0
    assert story.replay["hold_given_up"] is False  # no round outlasted --hold-max-s
    made = {v["version"]: v for v in story.versions}
    assert made["1"]["origin"] == "shipped"
    for r in story.rounds:
        assert made[r]["origin"] == "online-learner" and made[r]["parent"] == "1"
    # every workflow was served by the champion or a challenger the learner made
    assert {o.version for o in outcomes} <= {"v1", *(f"v{r}" for r in story.rounds)}
    doc = json.loads(json.dumps(story.to_dict(), default=str))
    before, after = doc["sla"]["before_shift"]["all"], doc["sla"]["after_shift"]["all"]
    assert doc["shift"]["oom_restart_s"] > 0 and doc["shift"]["at_s"] == story.shift_at_s
    assert (before["workflows"], after["workflows"]) == (3, 7)
    assert 0.0 <= before["sla_attainment"] <= 1.0


async def test_time_stands_still_until_the_loop_is_idle_or_past_its_limit():
    learner, evaluator = SimpleNamespace(busy=True), SimpleNamespace(busy=False)
    # the two flags the demo polls; the services themselves are the whole-demo test's
    still = TimeStandsStill(learner, evaluator, max_s=60.0)

    async def finish_round() -> None:
        await asyncio.sleep(0.3)
        learner.busy = False

    done = asyncio.create_task(finish_round())
    await still.hold()
    assert done.done() and not still.gave_up  # it held until the round ended
    assert still.held_s >= 0.3

    evaluator.busy = True  # a replay that outlasts the limit ends the holding for good
    short = TimeStandsStill(learner, evaluator, max_s=0.2)
    await short.hold()
    assert short.gave_up and 0.2 <= short.held_s < 5.0
    held = short.held_s
    await short.hold()  # past the limit, simulated time no longer waits for the loop
    assert short.held_s == held
