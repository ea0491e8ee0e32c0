"""Readiness means ready: `/healthz` says `starting` (503) until the model is loaded and every
served scheduler is warmed (the heuristic may decide meanwhile), and a hot-loaded version is
warmed before it serves."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from typing import Any

from dagsched.registry import serving
from dagsched.registry.promotion import Promoter
from dagsched.registry.store import Registry
from dagsched.settings import Settings
from tests.daemon.conftest import Client, http_get, register_version, wait_for
from tests.daemon.test_reload import listening, notices_only


async def healthz(port: int) -> tuple[int, dict[str, Any]]:
    status, body = await http_get(port, "/healthz")
    doc: dict[str, Any] = json.loads(body)
    return status, doc


async def test_healthz_is_not_ready_until_the_model_is_loaded_and_warmed(
    settings: Settings, champion: Registry, client: Client, start_daemon
):
    # the model load waits for the test (the registry is real; only its timing is held) past
    # the start-up grace, so the heuristic decides meanwhile: serving, but not ready
    s = settings.model_copy(update={"daemon": settings.daemon.model_copy(update={"grace_s": 0.5})})
    release = threading.Event()

    def held_loader(st: Settings, alias: str) -> Any:
        release.wait(30)
        return serving.load_alias(st, alias)

    await client.heartbeats(2)
    try:
        d = await start_daemon(s, registry=True, loader=held_loader)  # returns once assigned
        await client.workflow("wf-0")
        await client.ready("wf-0", 0)
        (early,) = await client.wait("decisions", 1)
        assert early.arm == "fallback"
        status, doc = await healthz(d.port)
        assert (status, doc["status"], doc["ready"]) == (503, "starting", False)
        assert doc["models"]["champion"] is None and "v1" not in doc["warmup_s"]
        release.set()

        async def ready() -> bool:
            return (await healthz(d.port))[0] == 200

        await wait_for(ready, 30, "/healthz 200")
    finally:
        release.set()
    status, doc = await healthz(d.port)
    assert (doc["status"], doc["ready"], doc["models"]["champion"]) == ("ok", True, "v1")
    assert doc["warmup_s"]["v1"] > 0 and doc["warmup_s"][doc["fallback"]] > 0
    m = await d.metrics()
    assert m.value("dagsched_warmup_seconds", version="v1") > 0
    # ready means serving the model: the next task is decided by it
    await client.ready("wf-0", 1)
    second = (await client.wait("decisions", 2))[1]
    assert (second.arm, second.model_version) == ("champion", "v1")


async def test_a_hot_loaded_version_is_warmed_before_it_serves(
    settings: Settings, champion: Registry, client: Client, start_daemon, redis
):
    s = notices_only(settings)
    await client.heartbeats(2)
    d = await start_daemon(s, registry=True)
    await d.until_serving("champion", "v1")
    v2 = await asyncio.to_thread(register_version, champion, "a second version")
    await listening(redis, s)

    seen: list[dict[str, Any]] = []

    async def watch() -> None:  # every /healthz document from before the promotion on
        while True:
            seen.append((await healthz(d.port))[1])
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await wait_for(lambda: seen, 10, "a first /healthz document")
        await asyncio.to_thread(Promoter(champion).promote, v2, "test", "tester")
        await wait_for(lambda: seen[-1]["models"]["champion"] == f"v{v2}", 30, f"v{v2} to serve")
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
    serving_v2 = [doc for doc in seen if doc["models"]["champion"] == f"v{v2}"]
    assert serving_v2 and all(doc["warmup_s"].get(f"v{v2}", 0) > 0 for doc in serving_v2)
    assert all(doc["status"] == "ok" for doc in seen)  # the reload never made it unready
    m = await d.metrics()
    assert m.value("dagsched_warmup_seconds", version=f"v{v2}") > 0
    assert "v1" not in seen[-1]["warmup_s"]  # what serves no more is dropped
    assert m.value("dagsched_warmup_seconds", version="v1") == 0
    await client.workflow("wf-0")
    await client.ready("wf-0", 0)
    (first,) = await client.wait("decisions", 1)
    assert (first.arm, first.model_version) == ("champion", f"v{v2}")
