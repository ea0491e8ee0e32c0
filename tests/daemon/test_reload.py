"""Hot reload between batches from a real MLflow store: a notice swaps the model; a version
whose stored artifact was tampered with is refused and the current one keeps serving; every
decision names the version that made it."""

from __future__ import annotations

import asyncio
import json

import redis.asyncio as aioredis

from dagsched.registry.promotion import Promoter
from dagsched.registry.serving import model_channel
from dagsched.registry.store import CHAMPION, Registry
from dagsched.settings import Settings
from tests.daemon.conftest import Client, register_version, stored_artifact, wait_for


def notices_only(settings: Settings) -> Settings:
    """A poll too slow to matter within a test: only a notice can make the daemon look."""
    return settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"reload_poll_s": 300.0})}
    )


async def listening(redis: aioredis.Redis, settings: Settings) -> None:
    """Until the daemon has subscribed to the model channel (a notice before that is lost)."""

    async def subscribed() -> bool:
        ((_, n),) = await redis.pubsub_numsub(model_channel(settings))
        return int(n) > 0

    await wait_for(subscribed, 20, "the daemon to subscribe to model notices")


async def test_a_notice_swaps_the_champion_between_batches(
    settings: Settings, champion: Registry, client: Client, start_daemon, redis
):
    s = notices_only(settings)
    await client.heartbeats(2)
    d = await start_daemon(s, registry=True)
    await d.until_serving("champion", "v1")
    await client.workflow("wf-0", n_tasks=3)
    await client.ready("wf-0", 0)
    first = (await client.wait("decisions", 1))[0]
    assert (first.arm, first.model_version) == ("champion", "v1")

    v2 = await asyncio.to_thread(register_version, champion, "a second version")
    await listening(redis, s)
    await asyncio.to_thread(Promoter(champion).promote, v2, "test", "tester")  # alias + notice
    await d.until_serving("champion", f"v{v2}", timeout=30)
    await client.ready("wf-0", 1)
    second = (await client.wait("decisions", 2))[1]
    assert (second.arm, second.model_version) == ("champion", f"v{v2}")
    m = await d.metrics()
    assert m.value("dagsched_model_info", arm="champion", version=f"v{v2}") == 1
    assert m.value("dagsched_model_info", arm="champion", version="v1") == 0
    assert m.value("dagsched_model_refused_total") == 0


async def test_a_tampered_version_is_refused_and_the_champion_keeps_serving(
    settings: Settings, champion: Registry, client: Client, start_daemon, redis
):
    s = notices_only(settings)
    await client.heartbeats(2)
    d = await start_daemon(s, registry=True)
    await d.until_serving("champion", "v1")

    v2 = await asyncio.to_thread(register_version, champion, "tampered after registration")
    weights = stored_artifact(champion, v2, "state_dict.pt")
    assert weights.is_relative_to(s.home)  # this test's own store, not the shared template
    with weights.open("ab") as f:
        f.write(b"\0")
    # moved by hand, past the promotion's checks: only the daemon's own load can catch it
    await asyncio.to_thread(champion.set_alias, CHAMPION, v2)
    await listening(redis, s)
    await redis.publish(model_channel(s), json.dumps({"action": "promote", "version": v2}))

    async def refused() -> bool:
        return (await d.metrics()).value("dagsched_model_refused_total") == 1

    await wait_for(refused, 30, "the daemon to refuse the tampered version")
    await client.workflow("wf-0", n_tasks=2)
    await client.ready("wf-0", 0)
    (decision,) = await client.wait("decisions", 1)
    assert (decision.arm, decision.model_version) == ("champion", "v1")
    assert (await d.health())["models"]["champion"] == "v1"
    m = await d.metrics()
    assert m.value("dagsched_model_info", arm="champion", version="v1") == 1
    assert m.value("dagsched_model_info", arm="champion", version=f"v{v2}") == 0
