"""The updater applies `dagsched.events` in batches: the same Redis state as one by one, a
redelivered batch changes nothing, and no reservation ledger outlives its task."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from dagsched.core.bounds import clamp_placement
from dagsched.core.workflow import TASK_TYPE_NAMES
from dagsched.daemon.broker import ensure_topics
from dagsched.daemon.history_store import Declared
from dagsched.daemon.kafka import make_producer, produce_all
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.redis_state import RedisState, Reservation
from dagsched.daemon.replay import ReplayConfig, replay
from dagsched.daemon.updater import UPDATER_GROUP_SUFFIX, Updater
from dagsched.schemas.messages import DecisionMsg, NodeDownMsg, decode
from dagsched.settings import Settings
from dagsched.sim.engine import Simulator
from dagsched.sim.executor import SimExecutor
from dagsched.sim.runner import generate_workflows, make_policy
from tests.daemon.conftest import (
    FAST_GROUP,
    Scrape,
    committed_offsets,
    make_settings,
    read_topic,
    wait_for,
)

FAULTS = {
    "sim.faults.node_failure_per_hour": 6.0,
    "sim.faults.repair_mean_s": 120.0,
    "sim.faults.transient_task_failure": 0.05,
}

Op = tuple[str, list[Any]]  # ("decide", reservations) | ("events", messages)


def _stream(s: Settings, seed: int) -> list[Op]:
    """A job queue's traffic on 8 nodes with crashes and failures: the decisions (as the
    daemon reserves them, with what each task declared) and the events that follow, in
    chunks of a few scheduling steps (decisions made before the last chunk's events are
    applied, as with an updater behind)."""
    wl = replace(s.sim.workload, workflows=10, size=(4, 12))
    sc = replace(s.sim, cluster=s.sim.cluster.scaled(8), workload=wl)
    sim = Simulator(sc, generate_workflows(sc, seed), seed=seed, keep_log=True)
    ex = SimExecutor(sim)
    policy = make_policy("least_loaded", seed)
    ops: list[Op] = []
    steps = 0
    ex.heartbeats()
    while (batch := sim.advance()) is not None:
        ex.events()
        reservations = []
        for d in policy.decide(sim, batch):
            t, node = d.task, ex.node_ids[d.node]
            attempt = ex.request(t).attempt
            cpu, mem, retries = clamp_placement(d.cpu, d.mem, d.max_retries)
            info, spec = sim.cluster.nodes[d.node], t.spec
            reservations.append(Reservation(
                f"{t.run.wf.id}/{t.idx}", attempt, node, cpu * info.cores, mem * info.mem_gb,
                cpu * info.cores * spec.duration_s, b'{"d":1}', fits=True,
                declared=Declared(spec.family, TASK_TYPE_NAMES[spec.type], spec.cpu_cores,
                                  spec.mem_gb, spec.duration_s),
            ))  # fmt: skip
            ok = ex.apply(t, DecisionMsg(
                workflow_id=t.run.wf.id, task=t.idx, attempt=attempt, node=node, cpu=cpu,
                mem=mem, max_retries=retries, model_version="t", arm="fallback",
                decided_at=0.0, latency_ms=0.0,
            ))  # fmt: skip
            assert ok  # the policy places on nodes the simulator knows alive
        ex.events()
        if steps % 8 == 0 or not ops:
            ops += [("decide", []), ("events", [])]
        ops[-2][1].extend(reservations)
        ops[-1][1].extend(m for stream, _, m in ex.outbox if stream == "events")
        ex.outbox.clear()
        steps += 1
    ex.events()
    ops.append(("events", [m for stream, _, m in ex.outbox if stream == "events"]))
    return ops


async def _dump(redis: aioredis.Redis, prefix: str) -> dict[str, Any]:
    """Every key under `prefix`: its value, and whether it expires."""
    out: dict[str, Any] = {}
    async for raw in redis.scan_iter(match=f"{prefix}*", count=1000):
        k = raw.decode()
        kind = (await redis.type(k)).decode()
        if kind == "hash":
            value: Any = await redis.hgetall(k)
        elif kind == "set":
            value = await redis.smembers(k)
        elif kind == "string":
            value = await redis.get(k)
        else:
            value = kind
        out[k[len(prefix) :]] = (value, await redis.ttl(k) > 0)
    return out


async def _caught_up(s: Settings, group_suffix: str = UPDATER_GROUP_SUFFIX) -> None:
    """Until the updater group has committed every event on the topic."""
    records = await read_topic(s, "events")
    ends = {p: rs[-1].offset + 1 for p, rs in records.items()}

    async def done() -> bool:
        got = await committed_offsets(s, "events", group_suffix)
        return all(got.get(p, 0) >= end for p, end in ends.items())

    await wait_for(done, 30, "the updater to commit every event")


async def test_batches_equal_one_by_one_and_a_redelivered_batch_changes_nothing(
    broker: Any, redis_url: str, tmp_path: Path, redis: aioredis.Redis
) -> None:
    # one partition: the updater sees the events in the order they are applied one by one
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"topics.partitions": 1}, **FAULTS)
    await ensure_topics(s)
    alone = RedisState(redis, s.model_copy(update={"topic_prefix": s.topic_prefix + "alone."}))
    batched = RedisState(redis, s)
    ops = _stream(s, seed=4)
    events = [m for kind, ms in ops if kind == "events" for m in ms]
    assert any(isinstance(m, NodeDownMsg) for m in events)  # resets are exercised
    assert sum(type(m).__name__ == "TaskFinishedMsg" for m in events) > 50

    metrics = DaemonMetrics()
    producer = make_producer(s)
    await producer.start()
    stop = asyncio.Event()
    updater = Updater(s, batched, producer, metrics, consumer_options=FAST_GROUP)
    task = asyncio.create_task(updater.run(stop))
    try:
        for kind, items in ops:
            if kind == "decide":
                assert await alone.decide_many([(r, "queue") for r in items]) == (
                    await batched.decide_many([(r, "queue") for r in items])
                )
                continue
            for m in items:
                await alone.apply_event(m)
            out = [(s.topic("events"), getattr(m, "node", "").encode(), m.encode()) for m in items]
            assert await produce_all(producer, out)
            await _caught_up(s)
        want = await _dump(redis, alone.prefix)
        assert await _dump(redis, batched.prefix) == want
        assert not [k for k in want if k.startswith("led:")]  # every attempt ended
        assert [k for k in want if k.startswith("hist:")]  # and history learnt from them
        scrape = Scrape(metrics.render().decode())
        applied = scrape.value("dagsched_events_applied_total")
        assert applied == len(events)
        assert applied >= 5 * scrape.value("dagsched_event_batches_total")  # in batches

        # new work holds reservations on every node; then the whole stream is delivered
        # again (another group of the updater's, from the first event): nothing changes
        fresh = [
            Reservation(f"again/{i}", 0, f"node-{i:04d}", 1.0, 1.0, 5.0, b"{}", fits=True)
            for i in range(8)
        ]
        await batched.decide_many([(r, "queue") for r in fresh])
        before = await _dump(redis, batched.prefix)
        assert [k for k in before if k.startswith("led:again/")]
        again = s.model_copy(
            update={"daemon": s.daemon.model_copy(update={"group_id": "redelivered"})}
        )
        second = Updater(again, batched, producer, DaemonMetrics(), consumer_options=FAST_GROUP)
        task2 = asyncio.create_task(second.run(stop))
        await _caught_up(again)
        assert await _dump(redis, batched.prefix) == before
    finally:
        stop.set()
        await task
        if "task2" in locals():
            await task2
        await producer.stop()


async def test_no_ledger_is_left_once_a_replays_tasks_end(
    broker: Any, redis_url: str, tmp_path: Path, redis: aioredis.Redis, start_daemon: Any
) -> None:
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **FAULTS)
    await ensure_topics(s)
    await start_daemon(s)
    out = await replay(s, ReplayConfig(workflows=12, seed=5, decision_timeout_s=30))
    assert out["decisions"] > 50
    records = await read_topic(s, "events")
    kinds = {decode(r.value).type for rs in records.values() for r in rs}
    assert {"node_down", "task_finished", "task_failed"} <= kinds
    await _caught_up(s)
    rs = RedisState(redis, s)
    assert [k async for k in redis.scan_iter(match=rs.key("led", "*"))] == []
    view = await rs.cluster_view()
    assert view.n == 32
    # every reservation was given back: the ledger's counts are the node's whole shape
    alive = view.alive
    np.testing.assert_allclose(view.free_cores[alive], view.cores[alive], atol=1e-6)
    np.testing.assert_allclose(view.free_mem[alive], view.mem_gb[alive], atol=1e-6)
    assert (view.queue_len == 0).all()
    np.testing.assert_allclose(view.queued_core_s, 0.0, atol=1e-6)
    # and history learnt, from what the daemon kept with each reservation
    assert [k async for k in redis.scan_iter(match=rs.key("hist", "*"))]
