"""The bounded decision log: one compact record per policy call on dagsched.decisionlog and in
Redis, capped in Redis by `daemon.decision_log_max_mb`; the learner's replay and `dagsched
explain` find the observation of every new decision in it."""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from pathlib import Path

import numpy as np
import redis.asyncio as aioredis
from aiokafka import AIOKafkaConsumer, TopicPartition

from dagsched.cli.explain.sources import DecisionStore
from dagsched.core.observation import observation_from_dict
from dagsched.core.wire import to_workflow
from dagsched.daemon.broker import ensure_topics
from dagsched.daemon.redis_state import RedisState
from dagsched.learner.decision_log import batch_observations, logged
from dagsched.policy.bundle import load_bundle
from dagsched.schemas.messages import DecisionBatchMsg, DecisionLogMsg, DecisionMsg, decode
from tests.daemon.conftest import Client, make_settings

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


async def test_the_redis_decision_log_stays_under_its_cap(broker, redis_url, tmp_path):
    cap_mb = 0.25
    s = make_settings(
        broker.bootstrap, redis_url, tmp_path, **{"daemon.decision_log_max_mb": cap_mb}
    )
    client = aioredis.from_url(redis_url)
    rs = RedisState(client, s)
    rng = random.Random(0)
    try:
        written = []
        for i in range(300):  # ~3 KB records, hardly compressible: ~1 MB in all, 4x the cap
            keys = [f"wf-{i}/{t}:0" for t in range(8)]
            raw = bytes(rng.getrandbits(8) for _ in range(3000))
            written.append(keys)
            await rs.put_decision_logs([(keys, raw)])
        ks, rk = rs.key("declog", "keys"), rs.key("declog", "recs")
        used = await client.memory_usage(ks, samples=0) + await client.memory_usage(rk, samples=0)
        assert used <= cap_mb * 2**20 * 1.1, used
        n = await client.xlen(ks)
        assert n == await client.xlen(rk) and 40 < n < 300  # oldest trimmed, newest kept
        last_id, fields = (await client.xrevrange(ks, count=1))[0]
        assert fields[b"k"].decode().split() == written[-1]
        (rec,) = await client.xrange(rk, min=last_id, max=last_id)
        assert len(zlib.decompress(rec[1][b"r"])) == 3000  # same id in both streams
        assert 0 < await client.ttl(ks) <= s.daemon.observation_ttl_s
        s0 = make_settings(
            broker.bootstrap, redis_url, tmp_path, **{"daemon.decision_log_max_mb": 0}
        )
        await RedisState(client, s0).put_decision_logs([(["wf/0:0"], b"x")])  # 0: none kept
        assert await client.exists(RedisState(client, s0).key("declog", "keys")) == 0
    finally:
        await client.aclose()


async def _read_all(s, topic: str) -> list[bytes]:
    c = AIOKafkaConsumer(bootstrap_servers=s.kafka_bootstrap, fetch_max_wait_ms=5)
    await c.start()
    try:
        tps = [TopicPartition(s.topic(topic), p) for p in range(s.topics.partitions)]
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        out: list[bytes] = []
        while [tp for tp in tps if await c.position(tp) < ends[tp]]:
            for recs in (await c.getmany(timeout_ms=200)).values():
                out += [r.value for r in recs]
        return out
    finally:
        await c.stop()


async def test_gnn_decisions_are_logged_per_batch_and_explain_and_replay_find_them(
    broker, redis_url, tmp_path, start_daemon
):
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"daemon.challenger_share": 0.0})
    await ensure_topics(s)
    champion = load_bundle(CHAMPION, "v1")

    def loader(_s, arm):
        return ("v1", champion) if arm == "champion" else None

    def version_of(_s, arm):
        return "v1" if arm == "champion" else None

    client = await Client(s).start()
    try:
        await client.heartbeats(4, cores=32, mem_gb=128)
        await start_daemon(s, registry=True, loader=loader, version_of=version_of)
        wfs = {f"wf-{w}": await client.workflow(f"wf-{w}", n_tasks=6) for w in range(4)}
        for w in wfs:
            for t in range(6):
                await client.ready(w, t)
        decisions = await client.wait("decisions", 24)
        assert {d.arm for d in decisions} == {"champion"}
        logs = [decode(raw) for raw in await _read_all(s, "decisionlog")]
    finally:
        await client.close()
    assert logs and all(isinstance(m, DecisionBatchMsg) for m in logs)
    # every new decision is in exactly one record; records are small
    keys = [d.key for m in logs for d in logged(m)]
    assert sorted(keys) == sorted({(f"{d.workflow_id}/{d.task}", d.attempt) for d in decisions})
    assert all(m.view is not None for m in logs)
    per_decision = sum(len(m.encode()) for m in logs) / len(keys)
    assert per_decision < 1500, per_decision
    # the learner's replay: one observation per task, on 4 nodes, the logged node valid
    wf_objs = {w: to_workflow(msg, 100) for w, msg in wfs.items()}
    for m in logs:
        for rec, obs in zip(m.tasks, batch_observations(m, wf_objs.get), strict=True):
            assert obs is not None and obs.nodes.shape[0] == 4 and obs.mask[rec.node_index]
    # explain finds a decision's observation in Redis (the record that names it)
    store = DecisionStore(s)
    # the Redis log is written while the batch's outputs are produced, committed after both:
    # the decisions can reach this reader a moment before their log is kept
    deadline = time.monotonic() + 10
    while store.recent_logs(1)[1] < 24 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    by_key = {(f"{d.workflow_id}/{d.task}", d.attempt): d for d in decisions}
    for key in [keys[0], keys[-1]]:
        attempt, raw_log, raw_dec = store.find(key[0], None)
        assert attempt == 0 and raw_dec is not None and raw_log is not None
        log = DecisionLogMsg.model_validate_json(raw_log)
        assert log.model_version == "v1" and log.observation is not None
        obs = observation_from_dict(log.observation)
        dec: DecisionMsg = by_key[key]
        again = champion.place_observations([obs])[0]  # the model decides the same again
        # (the 4 nodes are alike: ties between nodes in the same state go to the first on
        # both paths, `core.ties`)
        assert again.node == log.node_index, (again.node, log.node_index)
        assert dec.node == f"node-{log.node_index:04d}"
        assert np.allclose(champion.last_units[0], log.unit, atol=1e-4)
    recent, stored, bad = store.recent_logs(5)
    assert len(recent) == 5 and stored == 24 and bad == 0
    assert all(r.observation is not None for r in recent)
