"""The simulator as the job queue: a closed loop over Kafka through a running daemon."""

from __future__ import annotations

from collections import Counter

from dagsched.daemon.replay import ReplayConfig, parse_duration, replay
from dagsched.schemas.messages import DecisionMsg, decode
from tests.daemon.conftest import read_topic


def test_parse_duration():
    assert parse_duration("600") == (600.0, None)
    assert parse_duration("90s") == (90.0, None)
    assert parse_duration("12wf") == (None, 12)


async def test_replay_round_trip_decides_every_task_once(settings, start_daemon):
    d = await start_daemon()
    cfg = ReplayConfig(workflows=6, malformed=0.2, seed=3, decision_timeout_s=30)
    out = await replay(settings, cfg)
    assert out["workflows"] == 6
    assert out["tasks"] > 0 and out["malformed_sent"] > 0
    # every request got exactly one decision: none missing, none twice
    assert out["decisions_received"] == out["tasks_sent"]
    assert out["duplicates"] == 0
    # a decision for a node that died meanwhile is re-requested; every other one was placed
    assert out["decisions"] == out["tasks_sent"] - out["rejected"]
    assert out["dead_letters"] == out["malformed_sent"]
    for key in ("sla_attainment", "mean_jct_s", "makespan_s", "wall_s"):
        assert key in out

    # the same, read independently from the decisions topic and the daemon's /metrics
    stored = await read_topic(settings, "decisions", at_least=out["tasks_sent"])
    got = [decode(r.value) for rs in stored.values() for r in rs]
    assert all(isinstance(x, DecisionMsg) for x in got)
    per_request = Counter((x.workflow_id, x.task, x.attempt) for x in got)
    assert len(per_request) == out["tasks_sent"] and set(per_request.values()) == {1}
    assert {(x.arm, x.model_version) for x in got} == {("fallback", "heuristic:least_loaded")}
    m = await d.metrics()
    assert m.value("dagsched_decisions_total", arm="fallback") == out["tasks_sent"]
    assert m.value("dagsched_fallback_decisions_total") == out["tasks_sent"]
    assert m.value("dagsched_duplicate_decisions_total") == 0
    assert m.value("dagsched_dead_letters_total") == out["malformed_sent"]
