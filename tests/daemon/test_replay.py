"""The simulator as the job queue: a closed loop over Kafka through a running daemon."""

from __future__ import annotations

from dagsched.daemon.replay import ReplayConfig, parse_duration, replay


def test_parse_duration():
    assert parse_duration("600") == (600.0, None)
    assert parse_duration("90s") == (90.0, None)
    assert parse_duration("12wf") == (None, 12)


async def test_replay_round_trip_decides_every_task(settings, start_daemon):
    await start_daemon()
    cfg = ReplayConfig(workflows=6, malformed=0.2, seed=3, decision_timeout_s=30)
    out = await replay(settings, cfg)
    assert out["workflows"] == 6
    assert out["decisions"] >= out["tasks"] > 0
    assert out["tasks_sent"] == out["decisions"] + out["rejected"]
    assert out["decisions_received"] >= out["tasks_sent"]
    assert out["malformed_sent"] > 0
    assert out["dead_letters"] == out["malformed_sent"]
    for key in ("sla_attainment", "mean_jct_s", "makespan_s", "duplicates", "wall_s"):
        assert key in out
