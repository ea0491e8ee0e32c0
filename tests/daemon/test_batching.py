"""How the daemon forms batches: what has arrived is decided at once when the broker holds
nothing more (`daemon.batch_wait_ms` is only for records the broker has and the daemon has not
fetched yet)."""

from __future__ import annotations

import time

from dagsched.daemon.broker import ensure_topics
from tests.daemon.conftest import Client, make_settings


async def test_a_task_on_an_idle_topic_is_not_held_for_more_input(
    broker, redis_url, tmp_path, start_daemon
):
    # a batch that waited its full `batch_wait_ms` for more input would answer after 10 s
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"daemon.batch_wait_ms": 10_000})
    await ensure_topics(s)
    client = await Client(s).start()
    try:
        await client.heartbeats(2)
        await start_daemon(s)
        await client.workflow("wf-0", n_tasks=2)
        await client.wait("decisions", 0)
        began = time.monotonic()
        await client.ready("wf-0", 0)
        (decision,) = await client.wait("decisions", 1, timeout=8.0)
        assert decision.workflow_id == "wf-0" and decision.task == 0
        assert time.monotonic() - began < 8.0
        began = time.monotonic()
        await client.ready("wf-0", 1)  # the topic idle again: the next one too
        await client.wait("decisions", 2, timeout=8.0)
        assert time.monotonic() - began < 8.0
    finally:
        await client.close()
