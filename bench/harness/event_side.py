"""The daemon throughput bench's event side: the updater draining a backlog of events at
saturation, and a closed loop (tasks paced in, decisions out, their events back in) in which
the updater's lag is sampled.

The event mix is what a cluster reports per decision: the attempt started, then finished (or
failed: 3% transient, 1% OOM-killed), and one node heartbeat; three events per decision. Each
attempt's measured use is drawn around what its task declared, so history learns.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
import random
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from dagsched.settings import Settings
from harness.kafka_io import heartbeats, producer, publish, workload
from harness.replicas import Replica, replica_env, stop_replica
from harness.stack import REPO
from harness.throughput_report import cpu_seconds, redis_bytes

NODES = 32
FINISH_AFTER = 256  # saturation backlog: an attempt ends this many starts after its own
FINISH_S = 1.0  # closed loop: an attempt ends this long after its decision arrived
LAG_SAMPLE_S = 0.1


def _specs(wfs: list[tuple[str, bytes]]) -> dict[str, list[Any]]:
    from dagsched.schemas.messages import WorkflowMsg

    return {wf_id: WorkflowMsg.model_validate_json(raw).tasks for wf_id, raw in wfs}


def end_event(
    rng: random.Random, wf: str, task: int, node: str, spec: Any, at: float, attempt: int = 0
) -> Any:
    """An attempt's end: finished with its measured use, or (4%) failed."""
    from dagsched.schemas.messages import TaskFailedMsg, TaskFinishedMsg

    runtime = spec.duration_s * rng.uniform(0.7, 1.3)
    used = {
        "workflow_id": wf, "task": task, "attempt": attempt, "node": node, "at": at,
        "runtime_s": runtime, "cpu_core_s": spec.cpu_cores * runtime * rng.uniform(0.4, 1.0),
        "peak_mem_gb": spec.mem_gb * rng.uniform(0.3, 0.95),
    }  # fmt: skip
    u = rng.random()
    if u < 0.01:
        return TaskFailedMsg(**{**used, "peak_mem_gb": spec.mem_gb * 0.8}, reason="oom")
    if u < 0.04:
        return TaskFailedMsg(**used, reason="transient")
    return TaskFinishedMsg(**used)


def _heartbeat(hbs: list[Any], i: int, at: float, rng: random.Random) -> Any:
    hb = hbs[i % len(hbs)]
    return hb.model_copy(
        update={"at": at, "used_cores": hb.cores * rng.random(), "queue_len": rng.randrange(8)}
    )


def backlog(n_tasks: int, seed: int) -> tuple[list[Any], list[tuple[str, bytes]]]:
    """Reservations for `n_tasks` decisions (as the daemon makes them) and their events in
    job-queue order: per decision a start, a heartbeat, and the end of an earlier one."""
    from dagsched.daemon.history_store import Declared
    from dagsched.daemon.redis_state import Reservation
    from dagsched.schemas.messages import TaskStartedMsg

    rng = random.Random(seed)
    wfs, ready = workload(n_tasks, f"u{seed}", seed=seed)
    specs = _specs(wfs)
    hbs = heartbeats()
    todo = [(wf, task) for (wf, task, _), _, _ in ready[:n_tasks]]
    reservations = []
    events: list[tuple[str, bytes]] = []
    started: list[tuple[str, int, str]] = []
    for i, (wf, task) in enumerate(todo):
        spec, node = specs[wf][task], hbs[i % NODES].node
        reservations.append(Reservation(
            f"{wf}/{task}", 0, node, spec.cpu_cores, spec.mem_gb,
            spec.cpu_cores * spec.duration_s, b'{"bench":1}', fits=True,
            declared=Declared(spec.family or spec.name, spec.type, spec.cpu_cores, spec.mem_gb,
                              spec.duration_s),
        ))  # fmt: skip
        at = i * 0.001
        events.append((node, TaskStartedMsg(workflow_id=wf, task=task, attempt=0, node=node,
                                            at=at).encode()))  # fmt: skip
        started.append((wf, task, node))
        hb = _heartbeat(hbs, i * 7, at, rng)
        events.append((hb.node, hb.encode()))
        if i >= FINISH_AFTER:
            w, t, n = started[i - FINISH_AFTER]
            events.append((n, end_event(rng, w, t, n, specs[w][t], at).encode()))
    at = len(todo) * 0.001
    for w, t, n in started[max(0, len(todo) - FINISH_AFTER) :]:
        events.append((n, end_event(rng, w, t, n, specs[w][t], at).encode()))
    return reservations, events


class Committed:
    """A consumer group's committed offsets on the events topic, read with one admin client."""

    def __init__(self, s: Settings, group: str) -> None:
        from aiokafka import TopicPartition
        from aiokafka.admin import AIOKafkaAdminClient

        self.group = group
        self.admin = AIOKafkaAdminClient(bootstrap_servers=s.kafka_bootstrap)
        self.tps = [TopicPartition(s.topic("events"), p) for p in range(s.topics.partitions)]

    async def __aenter__(self) -> Committed:
        await self.admin.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.admin.close()

    async def offsets(self) -> dict[int, int]:
        """Per partition, the next offset the group will apply (0 before any commit)."""
        offs = await self.admin.list_consumer_group_offsets(self.group, partitions=self.tps)
        return {tp.partition: max(0, offs[tp].offset) if tp in offs else 0 for tp in self.tps}


async def start_updater(s: Settings) -> Replica:
    """`dagsched updater` as a process of its own (as deployed alone)."""
    s.home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dagsched.cli.main", "updater",
        cwd=str(REPO), env=replica_env(90, s, 1), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, limit=1 << 22,
    )  # fmt: skip
    r = Replica(90, proc, s.home / "updater.log", s.topic("events"))
    r.reader = asyncio.create_task(r.read())
    return r


def _lag_stats(samples: list[tuple[float, float]], skip_s: float) -> dict[str, Any]:
    lags = np.array([lag for t, lag in samples if t >= skip_s])
    if not lags.size:
        return {"samples": 0}
    return {
        "samples": int(lags.size),
        "p50_s": float(np.percentile(lags, 50)),
        "p99_s": float(np.percentile(lags, 99)),
        "max_s": float(lags.max()),
    }


async def _drain(
    committed: Committed,
    upd: Replica,
    samples: list[tuple[float, int, float]],
    total: int,
    deadline: float,
) -> None:
    """Sample (time, events committed, the updater's CPU seconds) until all `total` are."""
    while True:
        done = sum((await committed.offsets()).values())
        samples.append((time.monotonic(), done, cpu_seconds(upd.proc.pid) or 0.0))
        if done >= total or time.monotonic() > deadline:
            return
        if upd.proc.returncode is not None:
            raise RuntimeError(f"the updater exited: see {upd.log_path}")
        await asyncio.sleep(0.05)


async def updater_saturation(
    s: Settings, events_n: int, say: Callable[[str], Any], timeout: float
) -> dict[str, Any]:
    """A backlog of ~`events_n` events published first, then `dagsched updater` started: events
    applied per second between 10% and 90% of the backlog committed, its CPU per event, and
    what is left in Redis once it is drained."""
    import redis.asyncio as aioredis

    from dagsched.daemon.broker import ensure_topics
    from dagsched.daemon.redis_state import RedisState
    from dagsched.daemon.updater import UPDATER_GROUP_SUFFIX

    await ensure_topics(s)
    rds = aioredis.from_url(s.redis_url)
    rs = RedisState(rds, s)
    try:
        await rs.apply_events(heartbeats())
        reservations, events = await asyncio.to_thread(backlog, events_n // 3, 7)
        for i in range(0, len(reservations), 1000):
            await rs.decide_many([(r, "queue") for r in reservations[i : i + 1000]])
        t0 = time.monotonic()
        await asyncio.to_thread(publish, producer(s), s.topic("events"), events)
        say(f"(updater) backlog: {len(events):,} events of {len(reservations):,} decisions "
            f"published in {time.monotonic() - t0:.1f} s")  # fmt: skip
        group = s.topic_prefix + s.daemon.group_id + UPDATER_GROUP_SUFFIX
        started = time.monotonic()
        upd = await start_updater(s)
        samples: list[tuple[float, int, float]] = []
        try:
            async with Committed(s, group) as committed:
                await _drain(committed, upd, samples, len(events), started + timeout)
        finally:
            await stop_replica(upd)
        applied = samples[-1][1]
        out: dict[str, Any] = {"events": len(events), "decisions": len(reservations),
                               "applied": applied, "complete": applied >= len(events)}  # fmt: skip
        mid = [x for x in samples if 0.1 * len(events) <= x[1] <= 0.9 * len(events)]
        if len(mid) >= 2 and mid[-1][0] > mid[0][0]:
            out["per_s"] = (mid[-1][1] - mid[0][1]) / (mid[-1][0] - mid[0][0])
            out["cpu_us_per_event"] = (mid[-1][2] - mid[0][2]) / (mid[-1][1] - mid[0][1]) * 1e6
        first = next((t for t, d, _ in samples if d > 0), None)
        if first is not None:
            out["per_s_all"] = samples[-1][1] / max(1e-9, samples[-1][0] - started)
            out["first_commit_s"] = first - started
        out["ledgers_left"] = len([k async for k in rds.scan_iter(match=rs.key("led", "*"))])
        out["families_learnt"] = len([k async for k in rds.scan_iter(match=rs.key("hist", "*"))])
        return out
    finally:
        await rds.aclose()


class Feeder:
    """The cluster of the closed loop, in a thread: reads each new decision and reports its
    attempt started (now), a heartbeat, and the attempt's end `FINISH_S` later; all on the
    job-queue clock `now() - t0`. Notes when each decision arrived."""

    def __init__(self, s: Settings, specs: dict[str, list[Any]], t0: float) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.s, self.specs, self.t0 = s, specs, t0
        self.p = producer(s)
        self.c = Consumer({
            "bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.topic_prefix}bench-feeder",
            "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.min.bytes": 1,
        })  # fmt: skip
        self.c.assign(
            [TopicPartition(s.topic("decisions"), p, -2) for p in range(s.topics.partitions)]
        )
        self.hbs = heartbeats()
        self.rng = random.Random(3)
        self.arrived: dict[tuple[str, int], float] = {}
        self.newest_at = 0.0  # job-queue time of the newest event produced
        # per partition: offsets acked, and their events' times
        self.delivered: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
        self.events = 0
        self._ends: list[tuple[float, int, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def now(self) -> float:
        return time.time() - self.t0

    def _send(self, node: str, msg: Any) -> None:
        at = msg.at

        def acked(err: Any, m: Any) -> None:
            if err is None:
                offsets, ats = self.delivered[m.partition()]
                offsets.append(m.offset())
                ats.append(at)

        while True:
            try:
                self.p.produce(self.s.topic("events"), msg.encode(), node.encode(),
                               on_delivery=acked)  # fmt: skip
                break
            except BufferError:
                self.p.poll(0.001)
        self.newest_at = max(self.newest_at, at)
        self.events += 1

    def behind_s(self, committed: dict[int, int]) -> float:
        """The updater's lag: per partition, the newest event acked minus the newest one the
        group has applied (committed), in job-queue seconds; the worst partition."""
        worst = 0.0
        for part, (offsets, ats) in list(self.delivered.items()):
            n = len(offsets)
            if not n or offsets[n - 1] < committed.get(part, 0):
                continue  # all applied
            i = bisect.bisect_left(offsets, committed.get(part, 0), 0, n)  # first not applied
            applied_at = ats[i - 1] if i > 0 else ats[0]
            worst = max(worst, ats[n - 1] - applied_at)
        return worst

    def _run(self) -> None:
        import json

        from dagsched.schemas.messages import TaskStartedMsg

        n, seq = 0, 0
        while not self._stop.is_set():
            first = self.c.poll(0.005)
            msgs = [] if first is None else [first, *self.c.consume(10_000, 0)]
            at = self.now()
            for m in msgs:
                if m.error():
                    continue
                d = json.loads(m.value())
                k = (d["workflow_id"], d["task"])
                if d.get("type") != "decision" or k in self.arrived:
                    continue
                self.arrived[k] = time.time()
                node = d["node"]
                self._send(node, TaskStartedMsg(workflow_id=k[0], task=k[1], attempt=0,
                                                node=node, at=at))  # fmt: skip
                hb = _heartbeat(self.hbs, n, at, self.rng)
                self._send(hb.node, hb)
                n += 1
                seq += 1
                heapq.heappush(self._ends, (at + FINISH_S, seq, (k, node)))
            while self._ends and self._ends[0][0] <= at:
                _, _, ((wf, task), node) = heapq.heappop(self._ends)
                spec = self.specs[wf][task]
                self._send(node, end_event(self.rng, wf, task, node, spec, at))
            self.p.poll(0)
        self.p.flush(30)

    def pending(self) -> int:
        return len(self._ends)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.c.close()


def pace_ready(p: Any, s: Settings, todo: list[tuple[str, int]], rate: float, t0: float) -> float:
    """Offer `todo` as task_ready at `rate` per second, each `at` its send time on the
    job-queue clock; the rate achieved."""
    from dagsched.schemas.messages import TaskReadyMsg
    from harness.kafka_io import produce

    start = time.perf_counter()
    for i, (wf, task) in enumerate(todo):
        delay = start + i / rate - time.perf_counter()
        if delay > 0.0005:
            time.sleep(delay)
        msg = TaskReadyMsg(workflow_id=wf, task=task, attempt=0, at=time.time() - t0)
        produce(p, s.topic("tasks"), wf, msg.encode(), backoff_s=0.001)
    p.flush(60)
    return len(todo) / max(1e-9, time.perf_counter() - start)


async def closed_loop(
    s: Settings,
    start: Callable[[Settings], Any],
    decisions: int,
    rate: float,
    say: Callable[[str], Any],
    separate: bool = False,
) -> dict[str, Any]:
    """A daemon under `rate` tasks/s of `decisions` tasks whose events come back as they
    would from a cluster; its own updater applies them, or (`separate`) a `dagsched updater`
    process. Sampled every `LAG_SAMPLE_S`: the updater's lag (per partition, the newest event
    acked minus the newest its group has committed, in job-queue seconds; the worst) and the
    clock's (the newest event produced minus the clock in Redis, what a batch waits for).
    Afterwards: ledgers left, and what Redis holds per decision."""
    import redis.asyncio as aioredis

    from dagsched.daemon.broker import ensure_topics
    from dagsched.daemon.redis_state import RedisState
    from dagsched.daemon.updater import UPDATER_GROUP_SUFFIX

    await ensure_topics(s)
    rds = aioredis.from_url(s.redis_url)
    rs = RedisState(rds, s)
    await rs.apply_events(heartbeats())
    mem0 = (await rds.info("memory"))["used_memory"]
    wfs, ready = workload(decisions, "c", seed=11)
    todo = [(wf, task) for (wf, task, _), _, _ in ready[:decisions]]
    p = producer(s)
    await asyncio.to_thread(publish, p, s.topic("tasks"), wfs)
    procs = [await start(s)]
    if separate:
        procs.append(await start_updater(s))
    out: dict[str, Any] = {"decisions_offered": len(todo), "rate": rate, "separate": separate}
    feeder = None
    group = s.topic_prefix + s.daemon.group_id + UPDATER_GROUP_SUFFIX
    try:
        keys = [f"{s.topic_prefix}dagsched:wf:{w}" for w, _ in wfs]
        deadline = time.monotonic() + 120
        while await rds.exists(*keys) < len(keys) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        out["updater_ready_s"] = await _updater_ready(s, rds, rs)
        t0 = time.time()
        feeder = Feeder(s, _specs(wfs), t0)
        pacer = asyncio.create_task(asyncio.to_thread(pace_ready, p, s, todo, rate, t0))
        samples: list[tuple[float, float, float]] = []
        sent_done: float | None = None
        async with Committed(s, group) as committed:
            while True:
                clock = float(await rds.get(rs.key("clock")) or 0.0)
                behind = feeder.behind_s(await committed.offsets())
                now = feeder.now()
                samples.append((now, behind, max(0.0, feeder.newest_at - clock)))
                if pacer.done() and sent_done is None:
                    out["offered_per_s"] = pacer.result()
                    sent_done = now
                drained = len(feeder.arrived) >= len(todo) and not feeder.pending()
                if sent_done is not None and drained and behind == 0.0:
                    break
                if sent_done is not None and now - sent_done > 120:
                    break
                for r in procs:
                    if r.proc.returncode is not None:
                        raise RuntimeError(f"a process exited: see {r.log_path}")
                await asyncio.sleep(LAG_SAMPLE_S)
        arrived = sorted(feeder.arrived.values())
        out["decided"] = len(arrived)
        out["decided_per_s"] = (len(arrived) - 1) / max(1e-9, arrived[-1] - arrived[0])
        out["events"] = feeder.events
        out["events_per_decision"] = feeder.events / max(1, len(arrived))
        out["wall_s"] = samples[-1][0]
        out["lag"] = _lag_stats([(t, lag) for t, lag, _ in samples], skip_s=1.0)
        out["clock_lag"] = _lag_stats([(t, lag) for t, _, lag in samples], skip_s=1.0)
        out["lag_series"] = [(round(t, 2), round(a, 3), round(b, 3)) for t, a, b in samples[::10]]
        out["ledgers_left"] = len([k async for k in rds.scan_iter(match=rs.key("led", "*"))])
        out["redis"] = await redis_bytes(rds, s, len(arrived), mem0)
        out["redis"]["bytes_per_decision_per_s"] = _bytes_per_rate(out["redis"], s)
    finally:
        if feeder is not None:
            feeder.close()
        out["stopped"] = [await stop_replica(r) for r in procs]
        await rds.aclose()
    lag = out["lag"]
    where = "a process of its own" if separate else "in the daemon"
    say(f"(closedloop, updater {where}) {out['decided']:,} decisions at "
        f"{out.get('offered_per_s', 0):,.0f}/s offered ({out['decided_per_s']:,.0f}/s decided),"
        f" {out['events']:,} events: updater lag p50 {lag.get('p50_s', 0):.3f} s, "
        f"p99 {lag.get('p99_s', 0):.3f} s, max {lag.get('max_s', 0):.3f} s; "
        f"{out['ledgers_left']} ledgers left")  # fmt: skip
    return out


async def _updater_ready(s: Settings, rds: Any, rs: Any, timeout: float = 120.0) -> float:
    """Seconds until the daemon's updater applies a probe heartbeat (it has joined its group
    and consumes): the loop is measured from then, start-up left out."""
    hb = heartbeats()[0].model_copy(update={"used_cores": 0.125})
    t0 = time.monotonic()
    await asyncio.to_thread(publish, producer(s), s.topic("events"), [(hb.node, hb.encode())])
    while await rds.hget(rs.key("node", hb.node), "used_cores") != b"0.125":
        if time.monotonic() - t0 > timeout:
            raise TimeoutError("the daemon's updater applied no event")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


# key families held for a window per decision: stored decisions for `decision_ttl_s`, the
# workflows' keys for `workflow_ttl_s` past their last use; the rest (nodes, history, ledgers
# of running attempts, the decision log under its own cap) do not grow with the rate
DECISION_KEYS = ("dec",)
WORKFLOW_KEYS = ("wf", "wfactive", "wfdone", "wfnode")


def _bytes_per_rate(red: dict[str, Any], s: Settings) -> dict[str, float]:
    """Redis bytes per (decision/s of sustained rate): what one decision keeps, times how
    long it keeps it."""

    def per(families: tuple[str, ...]) -> float:
        total = sum(red["families"].get(f, {}).get("bytes", 0) for f in families)
        return total / max(1, red["decisions"])

    cfg = s.daemon
    dec, wf = per(DECISION_KEYS), per(WORKFLOW_KEYS)
    return {
        "decision_bytes_per_decision": dec,
        "workflow_bytes_per_decision": wf,
        "decision_ttl_s": cfg.decision_ttl_s,
        "workflow_ttl_s": cfg.workflow_ttl_s,
        "bytes_per_decision_per_s": dec * cfg.decision_ttl_s + wf * cfg.workflow_ttl_s,
        "decision_log_cap_bytes": cfg.decision_log_max_mb * 2**20,
    }
