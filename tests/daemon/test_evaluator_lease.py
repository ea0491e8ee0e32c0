"""Only one evaluator acts at a time: the Redis lease, and two evaluator services racing."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aioredis

from dagsched.learner.evaluation import Lease
from dagsched.learner.services import LEASE_KEY, EvaluatorService
from dagsched.settings import Settings
from tests.daemon.conftest import wait_for


async def test_lease_has_one_holder_and_expires(redis: aioredis.Redis, settings: Settings):
    key = settings.topic_prefix + LEASE_KEY
    a, b = Lease(redis, key, 0.3), Lease(redis, key, 0.3)
    assert await a.acquire()
    assert not await b.acquire()
    assert await a.acquire()  # renewal
    await asyncio.sleep(0.45)  # a stops renewing: the lease expires
    assert await b.acquire()
    assert not await a.acquire()  # a learns it lost the lease
    await b.release()
    assert await a.acquire()


async def test_two_evaluators_never_both_act(settings: Settings, redis: aioredis.Redis):
    s = settings.model_copy(
        update={"evaluator": settings.evaluator.model_copy(update={"lease_ttl_s": 0.6})}
    )
    verdicts: list[dict[str, Any]] = []
    stops = [asyncio.Event(), asyncio.Event()]
    services = [EvaluatorService(s, verdicts.append) for _ in stops]
    tasks = [asyncio.create_task(e.run(st)) for e, st in zip(services, stops, strict=True)]

    def holders() -> list[int]:
        return [i for i, e in enumerate(services) if e.lease is not None and e.lease.valid]

    try:
        await wait_for(lambda: len(holders()) == 1, 20, "one lease holder")
        first = holders()[0]
        for _ in range(40):  # 2 s: more than three lease periods
            assert len(holders()) == 1 and holders()[0] == first
            await asyncio.sleep(0.05)
        stops[first].set()  # the holder stops and releases: the other takes over
        await asyncio.wait_for(tasks[first], 20)
        await wait_for(lambda: holders() == [1 - first], 20, "the other evaluator to take over")
    finally:
        for st in stops:
            st.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert verdicts == []  # nothing to judge: no challenger
