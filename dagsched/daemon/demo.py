"""`dagsched demo`: the whole serving path on one machine, ending with a short story.

An embedded broker, one daemon replica serving the registry's champion (the shipped one on a
fresh clone), and the simulator replaying workflows through Kafka; then the same workload in
the simulator under two heuristics, for context.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace
from typing import Any

import structlog

from dagsched.daemon.broker import embedded_broker
from dagsched.daemon.replay import ReplayConfig, replay
from dagsched.daemon.service import Daemon
from dagsched.settings import Settings
from dagsched.sim.runner import simulate

log = structlog.get_logger("dagsched.demo")
MODEL_WAIT_S = 120.0


async def run_demo(settings: Settings, workflows: int, seed: int = 0) -> dict[str, Any]:
    """Broker + daemon + replay; returns the replay metrics and what served them."""
    demo = settings.model_copy(update={"topic_prefix": f"demo-{uuid.uuid4().hex[:8]}-"})
    async with embedded_broker(demo) as broker:
        s = demo.model_copy(update={"kafka_bootstrap": broker.bootstrap})
        log.info("demo.broker", bootstrap=broker.bootstrap)
        daemon = Daemon(s, metrics_port=0)
        task = asyncio.create_task(daemon.async_run())
        try:
            deadline = time.monotonic() + MODEL_WAIT_S
            while daemon.models.version("champion") is None and time.monotonic() < deadline:
                if task.done():
                    await task  # surfaces why the daemon stopped
                await asyncio.sleep(0.2)  # polling a load that runs in a worker thread
            served = daemon.models.version("champion") or "fallback (no model loaded)"
            log.info("demo.serving", champion=served)
            result = await replay(s, ReplayConfig(workflows=workflows, seed=seed))
        finally:
            daemon.stop()
            await task
    return {"served_by": served, **result, "daemon_decisions": daemon.stats["decisions"]}


def heuristic_context(settings: Settings, workflows: int, seed: int = 0) -> list[dict[str, Any]]:
    """The same number of workflows in the simulator under HEFT and least-loaded."""
    sc = replace(settings.sim, workload=replace(settings.sim.workload, workflows=workflows))
    return [simulate(sc, p, seed=seed) for p in ("heft", "least_loaded")]
