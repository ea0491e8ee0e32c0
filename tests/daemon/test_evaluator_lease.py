"""Only one evaluator acts at a time: the Redis lease, and two evaluator services racing.

No test here waits for time to pass: a lease's expiry is driven by expiring its key, and the
services' renewals are observed in Redis (the key's TTL jumps back up)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import redis.asyncio as aioredis

from dagsched.learner.live_ab import Lease
from dagsched.learner.services import LEASE_KEY, EvaluatorService
from dagsched.settings import Settings
from tests.daemon.conftest import wait_for


async def holder(redis: aioredis.Redis, key: str) -> tuple[bytes | None, int]:
    """The lease's owner token and its remaining milliseconds, read atomically."""
    async with redis.pipeline(transaction=True) as p:
        p.get(key)
        p.pttl(key)
        owner, ttl = await p.execute()
    return owner, int(ttl)


async def test_lease_has_one_holder_renews_and_expires(redis: aioredis.Redis, settings: Settings):
    key = settings.topic_prefix + LEASE_KEY
    a, b = Lease(redis, key, 30.0), Lease(redis, key, 30.0)  # never lapses by itself here
    assert await a.acquire()
    assert not await b.acquire()
    assert (await holder(redis, key))[0] == a.token.encode()
    await redis.pexpire(key, 5000)  # most of a's grant is used up...
    assert await a.acquire()  # ...and a renewal grants a whole ttl again
    owner, ttl = await holder(redis, key)
    assert owner == a.token.encode() and ttl > 25_000
    assert not await b.acquire()
    # a stops renewing and its grant runs out (driven here, rather than waited for)
    await redis.pexpire(key, 1)
    await wait_for(b.acquire, 10, "b to take the lapsed lease")
    assert (await holder(redis, key))[0] == b.token.encode()
    assert not await a.acquire()  # a learns it lost the lease
    assert not a.valid and b.valid
    await a.release()  # not the holder: nothing happens to b's lease
    assert (await holder(redis, key))[0] == b.token.encode()
    await b.release()
    assert await redis.exists(key) == 0
    assert await a.acquire()


async def test_two_evaluators_never_both_act(settings: Settings, redis: aioredis.Redis):
    # the holder renews every ttl/3, so it has two renewals' slack before its lease could lapse;
    # 4.5 s rides out a stalled event loop, and nothing here waits for a lease to lapse
    s = settings.model_copy(
        update={"evaluator": settings.evaluator.model_copy(update={"lease_ttl_s": 4.5})}
    )
    key = s.topic_prefix + LEASE_KEY
    verdicts: list[dict[str, Any]] = []
    stops = [asyncio.Event(), asyncio.Event()]
    services = [EvaluatorService(s, verdicts.append) for _ in stops]
    tasks = [asyncio.create_task(e.run(st)) for e, st in zip(services, stops, strict=True)]

    def token(i: int) -> bytes:
        lease = services[i].lease
        assert lease is not None
        return lease.token.encode()

    async def owner() -> int | None:
        got, _ = await holder(redis, key)
        if got is None or any(e.lease is None for e in services):
            return None
        return [token(i) for i in range(len(services))].index(got)

    try:

        async def held() -> bool:
            return await owner() is not None

        await wait_for(held, 20, "one lease holder")
        first = await owner()
        assert first is not None
        other = services[1 - first].lease
        # the holder renews twice (each seen as the key's TTL jumping back up), and the lease
        # never changes hands meanwhile, although the other evaluator keeps trying for it
        renewed, last = 0, None
        deadline = time.monotonic() + 30
        while renewed < 2:
            got, ttl = await holder(redis, key)
            assert got == token(first)
            assert other is not None and not other.valid
            if last is not None and ttl > last:
                renewed += 1
            last = ttl
            assert time.monotonic() < deadline, "the holder did not renew its lease"
            await asyncio.sleep(0.02)
        # the holder stops renewing, and its lease lapses: driven here (the key goes) rather
        # than waited for, so the takeover does not depend on the clock
        stops[first].set()
        await redis.delete(key)

        async def taken_over() -> bool:
            return await owner() == 1 - first

        await wait_for(taken_over, 20, "the other evaluator to take over")
        await asyncio.wait_for(tasks[first], 30)
        assert await owner() == 1 - first  # the old holder's release left the new lease alone
    finally:
        for st in stops:
            st.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert [t.exception() for t in tasks] == [None, None]
    assert await redis.exists(key) == 0  # a stopping holder releases its lease
    assert verdicts == []  # nothing to judge: no challenger


async def test_an_evaluator_waits_out_a_redis_outage(settings: Settings) -> None:
    # Redis goes away and comes back on the same port: the evaluator keeps running without
    # the lease, then takes it again (without the guard, its first failed acquire ended it)
    from structlog.testing import capture_logs

    from dagsched.daemon.redis_server import RedisServer

    server = RedisServer().start()
    ev = settings.evaluator.model_copy(update={"lease_ttl_s": 0.6})
    s = settings.model_copy(update={"redis_url": server.url, "evaluator": ev})
    stop = asyncio.Event()
    key = s.topic_prefix + LEASE_KEY
    client = aioredis.from_url(server.url)
    with capture_logs() as logs:
        task = asyncio.create_task(EvaluatorService(s, lambda _r: None).run(stop))
        try:
            await wait_for(lambda: client.exists(key), 30, "the lease")
            await client.aclose()
            server.stop()
            await wait_for(
                lambda: any(e["event"] == "evaluator.redis_unreachable" for e in logs),
                30,
                "an acquire to fail",
            )
            assert not task.done()
            server.start()
            client = aioredis.from_url(server.url)
            await wait_for(lambda: client.exists(key), 30, "the lease taken again")
            assert not task.done()
        finally:
            stop.set()
            await asyncio.wait_for(task, 30)
            await client.aclose()
            server.stop()
