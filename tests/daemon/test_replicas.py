"""Two replicas share the partitions; reservations race through Redis and never overcommit."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from dagsched.daemon.redis_state import RedisState, Reservation
from dagsched.registry.store import Registry
from dagsched.schemas.messages import NodeHeartbeatMsg
from tests.daemon.conftest import Client, wait_for


async def _node(rs: RedisState, node: str, cores: float, mem: float) -> None:
    await rs.apply_event(
        NodeHeartbeatMsg(node=node, at=0, kind="cpu", zone=0, cores=cores, mem_gb=mem)
    )


def _res(task: str, node: str, cores: float, decision: bytes, attempt: int = 0) -> Reservation:
    return Reservation(
        task_key=task,
        attempt=attempt,
        node=node,
        cores=cores,
        mem=1.0,
        core_s=cores * 10,
        decision=decision,
        fits=True,
    )


async def test_concurrent_reservations_never_overcommit(settings, rstate: RedisState):
    await _node(rstate, "n1", cores=8, mem=64)
    clients = [aioredis.from_url(settings.redis_url) for _ in range(2)]
    replicas = [RedisState(c, settings) for c in clients]
    try:
        # 20 tasks of 3 cores race from two replicas for 8 cores: at most 2 hold a reservation
        results = await asyncio.gather(
            *(
                replicas[i % 2].decide(_res(f"wf/{i}", "n1", 3.0, b"d%d" % i), queue_if_full=True)
                for i in range(20)
            )
        )
        states = [s for s, _ in results]
        assert states.count("r") == 2 and states.count("q") == 18
        # the same task raced by both replicas: one decision wins, the other gets it back; it
        # takes 1 of the 2 cores left, past the queue (nodes backfill)
        a, b = await asyncio.gather(
            replicas[0].decide(_res("wf/99", "n1", 1.0, b"first"), queue_if_full=True),
            replicas[1].decide(_res("wf/99", "n1", 1.0, b"second"), queue_if_full=True),
        )
        assert sorted([a[0], b[0]]) == ["dup", "r"]
        winner = a[1] if a[0] == "dup" else b[1]
        assert winner in (b"first", b"second")
        assert (await rstate.stored_decisions([("wf/99", 0)]))[0] == winner
    finally:
        for c in clients:
            await c.aclose()
    view = await rstate.cluster_view()
    assert view.free_cores[0] >= -1e-9 and view.free_cores[0] == 1.0
    assert view.queue_len[0] == 18


async def test_a_batched_round_reserves_in_order_and_races_converge(settings, rstate: RedisState):
    """One script call per round: entries see the earlier entries' reservations; two replicas
    racing whole rounds over the same tasks store exactly one decision per task, and every
    loser gets the winner's bytes; a redelivered round gets the same decisions back."""
    await _node(rstate, "n1", cores=8, mem=64)
    await _node(rstate, "n2", cores=8, mem=64)
    # in order within one call: the second 6-core entry no longer fits n1 ("fit" mode)
    got = await rstate.decide_many(
        [(_res("wf/a", "n1", 6.0, b"a"), "fit"), (_res("wf/b", "n1", 6.0, b"b"), "fit")]
    )
    assert got == [("r", None), ("nofit", None)]
    clients = [aioredis.from_url(settings.redis_url) for _ in range(2)]
    replicas = [RedisState(c, settings) for c in clients]
    try:
        for rnd in range(5):  # 5 rounds of 24 tasks, both replicas racing the same tasks
            tasks = [f"wf-{rnd}/{i}" for i in range(24)]

            def batch(r: int, tasks: list[str] = tasks) -> list[tuple[Reservation, str]]:
                return [
                    (_res(t, ("n1", "n2")[(i + r) % 2], 1.0, f"{t}@{r}".encode()), "queue")
                    for i, t in enumerate(tasks)
                ]

            a, b = await asyncio.gather(
                replicas[0].decide_many(batch(0)), replicas[1].decide_many(batch(1))
            )
            stored = await rstate.stored_decisions([(t, 0) for t in tasks])
            for t, (sa, wa), (sb, wb), dec in zip(tasks, a, b, stored, strict=True):
                assert sorted([sa, sb]) in (["dup", "r"], ["dup", "q"]), (t, sa, sb)
                mine = f"{t}@0".encode() if sa != "dup" else f"{t}@1".encode()
                assert dec == mine  # exactly one decision, the one that was stored first
                assert (wa if sa == "dup" else wb) == dec  # the loser got the winner's bytes
            again = await replicas[1].decide_many(batch(1))
            assert [w for _, w in again] == stored and {st for st, _ in again} == {"dup"}
    finally:
        for c in clients:
            await c.aclose()
    view = await rstate.cluster_view()
    assert (view.free_cores >= -1e-9).all()
    held = {n: await rstate.ledger(n) for n in ("n1", "n2")}
    assert sum(len(v) for v in held.values()) == 1 + 5 * 24  # one ledger entry per decision
    for n, entries in held.items():
        reserved = sum(float(e["cores"]) for e in entries if e["state"] == "r")
        assert reserved <= 8 + 1e-9, n


async def test_two_replicas_share_partitions_and_decide_each_task_once(
    settings, champion: Registry, client: Client, start_daemon, rstate: RedisState
):
    nodes = await client.heartbeats(3, cores=16, mem_gb=64)
    first = await start_daemon(registry=True)
    second = await start_daemon(registry=True)
    for d in (first, second):
        await d.until_serving("champion", "v1")

    def split() -> bool:
        a, b = first.daemon.consumer.assignment(), second.daemon.consumer.assignment()
        return bool(a) and bool(b) and not (a & b) and len(a | b) == settings.topics.partitions

    await wait_for(split, 30, "both replicas to hold partitions")
    # 24 workflows over 6 partitions; each entry task wants 6 cores (the nodes fit 2 each)
    for w in range(24):
        await client.workflow(f"wf-{w}", n_tasks=2, cores=6.0, mem_gb=8.0)
        await client.ready(f"wf-{w}", 0)
    got = await client.wait("decisions", 24, timeout=60)
    assert len({(d.workflow_id, d.task, d.attempt) for d in got}) == 24
    assert {(d.arm, d.model_version) for d in got} == {("champion", "v1")}  # both serve the GNN
    made = [(await d.metrics()).value("dagsched_decisions_total") for d in (first, second)]
    assert sum(made) == 24 and min(made) > 0, made  # both replicas served, each task once
    view = await rstate.cluster_view()
    assert (view.free_cores >= -1e-9).all() and (view.free_mem >= -1e-9).all()
    for node in nodes:  # what holds a reservation never exceeds the node
        held = [e for e in await rstate.ledger(node) if e["state"] == "r"]
        assert sum(float(e["cores"]) for e in held) <= 16 + 1e-9


async def test_heartbeat_telemetry_reaches_the_view(rstate: RedisState):
    await _node(rstate, "n1", cores=8, mem=64)  # an old-style heartbeat: no slowdown
    hb = NodeHeartbeatMsg(
        node="n2", at=1, kind="cpu", zone=0, cores=8, mem_gb=64, failure_rate=0.5, slowdown=2.5
    )
    await rstate.apply_event(hb)
    view = await rstate.cluster_view()
    assert view.node_ids == ["n1", "n2"]
    assert view.slowdown.tolist() == [1.0, 2.5]
    assert view.failure_rate.tolist() == [0.0, 0.5]


async def test_workflow_progress_reads_done_active_and_task_nodes(rstate: RedisState):
    from dagsched.schemas.messages import TaskFinishedMsg, TaskStartedMsg

    await _node(rstate, "n1", cores=8, mem=64)
    await rstate.decide_many([(_res(f"wf-p/{t}", "n1", 1.0, b"d"), "queue") for t in (0, 1, 2)])
    for t in (0, 1):
        await rstate.apply_event(
            TaskStartedMsg(workflow_id="wf-p", task=t, attempt=0, node="n1", at=1.0)
        )
    await rstate.apply_event(
        TaskFinishedMsg(workflow_id="wf-p", task=0, attempt=0, node="n1", at=2.0)
    )
    got = await rstate.workflow_progress(["wf-p", "wf-unknown"])
    assert got["wf-p"] == ({0}, {1, 2}, {0: "n1", 1: "n1"})
    assert got["wf-unknown"] == (set(), set(), {})


async def test_stored_decisions_live_for_the_configured_ttl(settings, redis: aioredis.Redis):
    """`daemon.decision_ttl_s` bounds how long a decision stays for redeliveries: Redis memory
    per decision times this window is what a deployment holds."""
    daemon = settings.daemon.model_copy(update={"decision_ttl_s": 120})
    rs = RedisState(redis, settings.model_copy(update={"daemon": daemon}))
    await _node(rs, "n1", cores=8, mem=64)
    assert await rs.decide(_res("wf/0", "n1", 1.0, b"d"), queue_if_full=True) == ("r", None)
    assert 0 < await redis.ttl(rs.key("dec", "wf/0:0")) <= 120
