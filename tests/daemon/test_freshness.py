"""A batch is decided on a view that has caught up with its requests' job-queue time."""

from __future__ import annotations

import time

from dagsched.schemas.messages import NodeHeartbeatMsg, TaskReadyMsg
from dagsched.settings import Settings
from tests.daemon.conftest import Client, wait_for


async def test_a_batch_waits_for_the_events_up_to_its_ready_time(
    settings: Settings, client: Client, start_daemon
):
    s = settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"view_wait_ms": 5000.0})}
    )
    await client.heartbeats(2)  # the daemon's clock: t = 0
    d = await start_daemon(s)
    await client.workflow("wf-f", n_tasks=2)
    # task 1 is ready at t = 100 because its parent finished then: the view must show it
    ready = TaskReadyMsg(workflow_id="wf-f", task=1, attempt=0, at=100.0)
    await client.send("tasks", ready.encode(), "wf-f")

    async def fetched() -> bool:  # both records are in a batch (observed before it is decided)
        return (await d.metrics()).value("dagsched_batch_size_sum") >= 2

    # the point of the test: the event the request depends on arrives after the request
    await wait_for(fetched, 20, "the daemon to fetch the request")
    sent = time.time()
    hb = NodeHeartbeatMsg(node="node-0000", at=100.0, kind="cpu", zone=0, cores=16, mem_gb=64)
    await client.send("events", hb.encode(), "node-0000")
    (decision,) = await client.wait("decisions", 1)
    assert decision.decided_at >= sent  # it waited for the clock to reach t = 100
    assert (await d.metrics()).value("dagsched_stale_views_total") == 0


async def test_a_late_view_gives_up_after_view_wait_ms(
    settings: Settings, client: Client, start_daemon
):
    s = settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"view_wait_ms": 50.0})}
    )
    await client.heartbeats(2)
    d = await start_daemon(s)
    await wait_for(lambda: d.knows_nodes(2), what="the daemon to know both nodes")
    await client.workflow("wf-g", n_tasks=2)
    ready = TaskReadyMsg(workflow_id="wf-g", task=1, attempt=0, at=100.0)
    await client.send("tasks", ready.encode(), "wf-g")
    (decision,) = await client.wait("decisions", 1)  # decided on what it knew
    assert decision.node in ("node-0000", "node-0001")
    assert (await d.metrics()).value("dagsched_stale_views_total") == 1


async def test_a_new_workflows_first_tasks_follow_no_event_and_do_not_wait(
    settings: Settings, client: Client, start_daemon
):
    """A root task's first attempt becomes ready when its workflow arrives: no event
    happens at that instant for the view to catch up with."""
    s = settings.model_copy(
        update={"daemon": settings.daemon.model_copy(update={"view_wait_ms": 5000.0})}
    )
    await client.heartbeats(2)  # the daemon's clock: t = 0
    d = await start_daemon(s)
    await wait_for(lambda: d.knows_nodes(2), what="the daemon to know both nodes")
    await client.workflow("wf-r", n_tasks=2)
    ready = TaskReadyMsg(workflow_id="wf-r", task=0, attempt=0, at=100.0)
    await client.send("tasks", ready.encode(), "wf-r")
    await client.wait("decisions", 1)
    # it neither waited out the 5 s for an event at t = 100 nor counted a stale view
    assert (await d.metrics()).value("dagsched_stale_views_total") == 0
    retry = TaskReadyMsg(workflow_id="wf-r", task=0, attempt=1, at=200.0)
    await client.send("tasks", retry.encode(), "wf-r")
    await client.wait("decisions", 2)  # a retry follows its attempt's end: it waited for it
    assert (await d.metrics()).value("dagsched_stale_views_total") == 1
