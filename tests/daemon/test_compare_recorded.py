"""`dagsched models compare --recorded`: the paired replay on the traffic the services
recorded on the broker, read back from its topics."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

from dagsched.cli.main import run
from dagsched.daemon.replay import Replay, ReplayConfig
from dagsched.learner.recorded import read_records, windows_of
from dagsched.learner.replay_judge import config_from
from dagsched.settings import Settings

WORKFLOWS = 40
WINDOW = 10


def _env(monkeypatch: pytest.MonkeyPatch, s: Settings, bootstrap: str | None = None) -> None:
    env: dict[str, str] = {
        "KAFKA_BOOTSTRAP": bootstrap or s.kafka_bootstrap,
        "TOPIC_PREFIX": s.topic_prefix,
        "HOME": str(s.home),
        "EVALUATOR__REPLAY__WINDOW_WORKFLOWS": str(WINDOW),
        "EVALUATOR__REPLAY__WARMUP_WORKFLOWS": str(WINDOW),
        "EVALUATOR__REPLAY__AFTER_WORKFLOWS": str(WINDOW),
    }
    for name, value in env.items():
        monkeypatch.setenv(f"DAGSCHED_{name}", value)


async def test_compare_replays_the_traffic_recorded_on_the_broker(
    settings: Settings, start_daemon: Any, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    s = settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"view_wait_ms": 30.0})}
    )
    await start_daemon(s)
    await Replay(s, ReplayConfig(workflows=WORKFLOWS, seed=3)).run(asyncio.Event())

    records = await read_records(s)
    cfg = config_from(s.evaluator.replay)
    cfg = replace(cfg, window_workflows=WINDOW, warmup_workflows=WINDOW, after_workflows=WINDOW)
    got = windows_of(s, cfg, records)
    # every workflow arrived and ended, as the events told it, and the windows closed
    assert got.workflows == WORKFLOWS and got.ended == WORKFLOWS and got.bad == 0
    assert [w.index for w in got.windows] == list(range(WORKFLOWS // WINDOW))
    assert all(len(w.jct_s) == WINDOW and min(w.jct_s.values()) > 0 for w in got.windows)
    assert got.windows[-1].warmup and got.windows[-1].history  # the window's start state

    _env(monkeypatch, s)
    argv = ["--profile", "test", "models", "compare", s.daemon.fallback_policy, "random",
            "--recorded", "--window", "10h", "--replays", "2", "--json"]  # fmt: skip
    assert await asyncio.to_thread(run, argv) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])  # after the daemon's logs
    assert doc["source"].startswith("recorded traffic: 4 of 4 closed windows")
    assert [w["window"] for w in doc["windows"]] == [0, 1, 2, 3]
    # the fallback heuristic served it: the replays of what served predict what was observed
    assert doc["fidelity"]["observed_jct_s"] > 0 and doc["fidelity"]["jct_err"] < 0.25
    assert doc["stats"]["jct"]["diff"] < 0  # random placement is slower on the same traffic


async def test_compare_recorded_without_a_broker_is_one_line_exit_2(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _env(monkeypatch, settings, bootstrap="127.0.0.1:1")
    argv = ["--profile", "test", "models", "compare", "heft_history", "random", "--recorded"]
    assert await asyncio.to_thread(run, argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "--recorded" in err and "\n" not in err
