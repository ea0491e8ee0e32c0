"""A daemon over the real broker, Redis and MLflow store: tasks in, GNN decisions out, offsets
committed after."""

from __future__ import annotations

from dagsched.learner.decision_log import logged
from dagsched.registry.store import Registry
from dagsched.schemas.messages import DecisionBatchMsg, DecisionMsg, decode
from tests.daemon.conftest import Client, committed, end_offsets, read_topic, wait_for


async def test_tasks_get_decisions_and_offsets_follow(
    settings, champion: Registry, client: Client, start_daemon
):
    nodes = await client.heartbeats(4)
    d = await start_daemon(registry=True)
    await d.until_serving("champion", "v1")
    for w in range(3):
        await client.workflow(f"wf-{w}", n_tasks=3)
        await client.ready(f"wf-{w}", 0)
    decisions = await client.wait("decisions", 3)
    assert {(x.workflow_id, x.task, x.attempt) for x in decisions} == {
        (f"wf-{w}", 0, 0) for w in range(3)
    }
    for x in decisions:
        assert isinstance(x, DecisionMsg)
        assert x.node in nodes
        assert x.arm == "champion" and x.model_version == "v1"  # the registered GNN
        assert 0.1 <= x.cpu <= 0.9 and 0.2 <= x.mem <= 0.8 and 1 <= x.max_retries <= 5
        assert x.log_prob <= 0 and x.latency_ms >= 0
    # every input (3 workflows + 3 task_ready) is committed, and only after its output
    total = await end_offsets(settings)
    assert total == 6
    await wait_for(lambda: _eq(committed(settings), total), what="all offsets committed")
    assert client.got["deadletter"] == []
    # the GNN logged what it saw for each decision (the fallback logs no observation): one
    # decision_batch per policy call, a record per task, the observations replayable
    stored = await read_topic(settings, "decisionlog", at_least=1)
    msgs = [decode(r.value) for rs in stored.values() for r in rs]
    assert all(isinstance(m, DecisionBatchMsg) for m in msgs)
    logs = [rec for m in msgs for rec in logged(m)]
    while len(logs) < 3:  # the calls of one batch may land as several records
        stored = await read_topic(settings, "decisionlog", at_least=len(msgs) + 1)
        msgs = [decode(r.value) for rs in stored.values() for r in rs]
        logs = [rec for m in msgs for rec in logged(m)]
    assert sorted(rec.key for rec in logs) == [(f"wf-{w}/0", 0) for w in range(3)]
    for rec in logs:
        assert rec.model_version == "v1" and rec.has_observation

    m = await d.metrics()
    for name in (
        "dagsched_decisions_total",
        "dagsched_decision_latency_seconds_bucket",
        "dagsched_batch_size_bucket",
        "dagsched_dead_letters",
        "dagsched_consumer_lag",
        "dagsched_model_info",
        "dagsched_fallback_decisions_total",
        "dagsched_redis_state_age_seconds",
    ):
        assert name in m.text, name
    assert m.value("dagsched_decisions_total", arm="champion") == 3
    assert m.value("dagsched_decisions_total", arm="fallback") == 0
    assert m.value("dagsched_fallback_decisions_total") == 0
    assert m.value("dagsched_model_info", arm="champion", version="v1") == 1
    assert m.value("dagsched_decision_latency_seconds_count") == 3
    health = await d.health()
    assert health["status"] == "ok" and health["models"] == {
        "champion": "v1",
        "challenger": None,
        "holdback": None,
        "shadow": None,
    }


async def _eq(aw, value) -> bool:
    return (await aw) == value
