"""A daemon in the bench's own process (`experiments/daemon_profile.py`, `bench/daemon_burst.py`):
the topics and the default cluster prepared, and a `Daemon` serving the shipped champion."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable, Coroutine
from typing import Any

from dagsched.settings import Settings
from harness.kafka_io import heartbeats


async def prepare(s: Settings) -> Any:
    """The topics created and the default 32 nodes written as heartbeats; the Redis client."""
    import redis.asyncio as aioredis

    from dagsched.daemon.broker import ensure_topics
    from dagsched.daemon.redis_state import RedisState

    await ensure_topics(s)
    rds = aioredis.from_url(s.redis_url)
    rs = RedisState(rds, s)
    for hb in heartbeats():
        await rs.apply_event(hb)
    return rds


def champion_daemon(s: Settings) -> Any:
    """A `Daemon` serving the shipped champion as `v1` (no registry), garbage collector
    frozen after start-up as the `dagsched daemon` process does."""
    from dagsched.daemon.service import Daemon
    from dagsched.policy.bundle import load_bundle
    from dagsched.registry.store import SHIPPED_CHAMPION

    champion = load_bundle(SHIPPED_CHAMPION, "v1")
    return Daemon(
        s,
        freeze_gc=True,
        loader=lambda _s, arm: ("v1", champion) if arm == "champion" else None,
        version_of=lambda _s, arm: "v1" if arm == "champion" else None,
    )


def run_bench(main: Callable[[Any], Coroutine[Any, Any, None]], args: Any) -> None:
    """An in-process bench's entry: MLflow's telemetry off, warnings-only logs, `main(args)`
    run to completion, stdout flushed."""
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    asyncio.run(main(args))
    sys.stdout.flush()
