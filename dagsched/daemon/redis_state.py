"""Cluster state in Redis: nodes, workflows, reservations and the decision store.

Every key starts with `{topic_prefix}dagsched:` so two stacks can share one Redis.

| key | type | holds |
|---|---|---|
| `nodes` | set | node ids seen in heartbeats |
| `node:{id}` | hash | static shape, telemetry, `alive`, `seen_at` (last heartbeat), `reset_at` (last down or up), and the reservation ledger's `free_cores`, `free_mem`, `queue_len`, `queued_core_s` |
| `led:{wf}/{task}:{attempt}` | hash | one placement while its attempt lives: node, cores, mem, est. core-s, state `r` (holds a reservation) or `q` (waits in the node's queue), what the task declared (`fam`, `ty`, `dc`, `dm`, `dd`, `cold`: family, type, cpu, mem, duration, cold start) for history, and `adv`, its advertised run time on the node; deleted when the attempt ends or its node goes down |
| `run` | hash | ledger key -> "node, compute began, advertised run time, family" of each started attempt with an advertised run time, while its ledger entry lives: when the nodes' running attempts are expected to end (`ClusterView.running`) |
| `nodeled:{id}` | set | ledger keys on a node (dropped when it goes down) |
| `dec:{wf}/{task}:{attempt}` | string | the decision's JSON, written once (SET NX semantics), for `daemon.decision_ttl_s` (the redelivery window) |
| `declog:keys`, `declog:recs` | streams | the decision log: per policy call, the keys of its new decisions, and its `decision_batch` record (zlib), under the same stream id; capped by `daemon.decision_log_max_mb` and `observation_ttl_s` |
| `wf:{id}` | string | the workflow message JSON, until `daemon.workflow_ttl_s` after its last decision or event |
| `wfdone:{id}`, `wfactive:{id}` | sets | task indices done / decided and not done (TTL as `wf`, and `wfnode`) |
| `wfnode:{id}` | hash | task index -> node id of its latest started attempt |
| `clock` | string | latest event time (job-queue clock) |
| `hist:{family}` | hash | per-family history of measured outcomes (`daemon.history_store`) |

A decision, its reservation and its ledger entry are written by one Lua script, so two
replicas racing on the same task converge on one decision (the loser gets the winner's), and
two replicas racing on one node never reserve more than it has: a task that does not fit is
queued on the node (as the executor would queue it), not over-reserved. One call of the script
takes a whole batch round's reservations in order (one round trip per round, not per task);
being atomic, it interleaves with another replica's call only between rounds. The updater
applies `dagsched.events` a batch per script call the same way (`daemon.event_apply`).
"""  # noqa: E501

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis

from dagsched import redis_connect
from dagsched.core.history import FamilyStats
from dagsched.core.view import NODE_KINDS, ClusterView, RunningAttempts
from dagsched.core.workflow import TASK_TYPE_NAMES
from dagsched.daemon.event_apply import EventApplier, declared_fields
from dagsched.daemon.history_store import Declared, RedisHistory, parse_stats, stats_of_row
from dagsched.daemon.redis_scripts import (
    DECIDE_LUA,
    LOG_LUA,
    PROGRESS_LUA,
    STORED_LUA,
    VIEW_FIELDS,
    VIEW_LUA,
)
from dagsched.settings import Settings

LOG_ENTRY_OVERHEAD = 64  # first guess of what an entry costs beyond its values; then measured
LOG_CALIBRATE_EVERY = 64  # writes between measurements of what an entry really costs


def connect(settings: Settings, timeout_s: float = 1.0) -> aioredis.Redis:
    """An asyncio Redis client that fails fast (the daemon degrades instead of waiting)."""
    return redis_connect.async_client(settings, timeout_s=timeout_s, fail_fast=True)


@dataclass(frozen=True, slots=True)
class Reservation:
    """What one decision reserves: a ledger entry for (task key, attempt)."""

    task_key: str  # "{workflow id}/{task index}"
    attempt: int
    node: str
    cores: float
    mem: float
    core_s: float
    decision: bytes
    fits: bool  # the planner saw it fit; if Redis disagrees, re-plan instead of queueing
    declared: Declared | None = None  # kept in the ledger entry: what history learns from
    # the declared duration at the node's advertised speed, throttled when reserved below the
    # declared CPU: once the attempt starts, the view expects it to end from this
    advertised_s: float | None = None


class RedisState:
    """Typed operations on the keys above. Raises `redis.RedisError` when Redis is away."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        self.redis = redis
        self.settings = settings
        self.prefix = f"{settings.topic_prefix}dagsched:"
        self._decide = redis.register_script(DECIDE_LUA)
        self._log = redis.register_script(LOG_LUA)
        self._view = redis.register_script(VIEW_LUA)
        self._progress = redis.register_script(PROGRESS_LUA)
        self._stored = redis.register_script(STORED_LUA)
        self._log_entry_bytes = 0.0  # what one decision-log entry costs in Redis, both streams
        self._log_writes = 0
        self.history = RedisHistory(redis, self.key, settings.sim.cluster.speed)
        self.events = EventApplier(
            redis, self.prefix, settings.daemon.workflow_ttl_s, settings.sim.cluster.speed
        )

    def key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    # -- decision logs (what each decision was made from) --------------------------------------

    async def put_decision_logs(self, logs: Sequence[tuple[Sequence[str], bytes]]) -> None:
        """Keep new decision-log records (keys of their new decisions, `decision_batch` bytes)
        for `dagsched explain`, in one script call that also trims the log to its caps: the
        oldest records go once the log would pass `daemon.decision_log_max_mb`, or once they
        are older than `daemon.observation_ttl_s`."""
        cap = self.settings.daemon.decision_log_max_mb * 2**20
        if not logs or cap <= 0:
            return
        args: list[Any] = []
        for keys, raw in logs:
            packed = zlib.compress(raw, 1)
            joined = " ".join(keys)
            args += [joined, packed]
            if self._log_entry_bytes == 0:
                self._log_entry_bytes = len(packed) + len(joined) + 2 * LOG_ENTRY_OVERHEAD
        maxlen = max(1, int(cap / self._log_entry_bytes))
        ttl = self.settings.daemon.observation_ttl_s
        streams = [self.key("declog", "keys"), self.key("declog", "recs")]
        await self._log(keys=streams, args=[maxlen, ttl, *args])
        self._log_writes += 1
        if self._log_writes % LOG_CALIBRATE_EVERY == 0:
            # what an entry really costs (listpack nodes, allocator classes): the cap holds
            # only if the entry count is set from that, not from the payload alone
            pipe = self.redis.pipeline(transaction=False)
            for k in streams:
                pipe.memory_usage(k)
            pipe.xlen(streams[0])
            used_k, used_r, n = await pipe.execute()
            if n:
                self._log_entry_bytes = ((used_k or 0) + (used_r or 0)) / n

    # -- decisions ----------------------------------------------------------------------------

    async def stored_decisions(self, keys: Sequence[tuple[str, int]]) -> list[bytes | None]:
        """The stored decision for each (task key, attempt), or None (one script call with one
        argument and a compact reply: an MGET's reply is a bulk string or nil per key)."""
        if not keys:
            return []
        found, *values = await self._stored(
            args=[self.prefix, "\n".join(f"{k}:{a}" for k, a in keys)]
        )
        it = iter(values)
        return [_bytes(next(it)) if f == 49 else None for f in _bytes(found)]  # 49: b"1"

    async def decide(
        self, r: Reservation, queue_if_full: bool, force: bool = False
    ) -> tuple[str, bytes | None]:
        """Store the decision and take its reservation in one step.

        Returns ("r" | "q", None) when stored (reserved / queued), ("dup", decision) when another
        replica stored one first, ("dead", None) or ("nofit", None) when it must be re-planned.
        `force` (resync after an outage) stores the decision even on a dead or unknown node.
        """
        mode = "force" if force else "queue" if queue_if_full else "fit"
        return (await self.decide_many([(r, mode)]))[0]

    async def decide_many(
        self, items: Sequence[tuple[Reservation, str]]
    ) -> list[tuple[str, bytes | None]]:
        """`decide` for a whole round in one atomic script call, in order: each entry sees the
        reservations of the entries before it. `items` pairs a reservation with its mode,
        "fit" (re-plan when it does not fit), "queue" (queue it then) or "force"."""
        if not items:
            return []
        lines = []
        for r, mode in items:
            if b"\n" in r.decision:  # JSON has none; the script splits entries on it
                raise ValueError("a decision with a raw newline")
            head = f"{r.task_key}\t{r.attempt}\t{r.node}\t{r.cores!r}\t{r.mem!r}\t{r.core_s!r}"
            adv = "" if r.advertised_s is None else repr(r.advertised_s)
            line = f"{head}\t{mode}\t{declared_fields(r.declared)}\t{adv}\t"
            lines.append(line.encode() + r.decision)
        cfg = self.settings.daemon
        statuses, *winners = await self._decide(
            args=[cfg.decision_ttl_s, self.prefix, b"\n".join(lines), cfg.workflow_ttl_s]
        )
        it = iter(winners)
        return [
            ("dup", _bytes(next(it))) if c == "d" else (_STATUS[c], None) for c in _str(statuses)
        ]

    # -- workflows ----------------------------------------------------------------------------

    async def put_workflows(self, items: Sequence[tuple[str, bytes]]) -> None:
        """Store workflow messages by id."""
        if not items:
            return
        pipe = self.redis.pipeline(transaction=False)
        for wf_id, raw in items:
            pipe.set(self.key("wf", wf_id), raw, ex=self.settings.daemon.workflow_ttl_s)
        await pipe.execute()

    async def get_workflows(self, ids: Sequence[str]) -> list[bytes | None]:
        if not ids:
            return []
        return _bytes_list(await self.redis.mget([self.key("wf", i) for i in ids]))

    async def workflow_progress(self, ids: Sequence[str]) -> dict[str, Progress]:
        """Per workflow: done task indices, active ones, and the node each task last ran on."""
        if not ids:
            return {}
        return _progress_from(ids, await self._progress(args=[self.prefix, *ids]))

    # -- nodes --------------------------------------------------------------------------------

    async def cluster_view(self) -> ClusterView:
        """Every known node, sorted by id, as the view a scheduler sees, with the attempts
        running on them (one script call)."""
        return self._view_from(*await self._read_view())

    def _read_view(self, client: Any = None) -> Any:
        return self._view(
            keys=[self.key("nodes"), self.key("clock"), self.key("run")],
            args=[self.key("node", ""), self.key("hist", ""), *VIEW_FIELDS],
            client=client,
        )

    def _view_from(
        self,
        text: bytes | str,
        clock: bytes | str | None,
        running: bytes | str = b"",
        hists: bytes | str = b"",
    ) -> ClusterView:
        cells = [line.split("\t") for line in _str(text).split("\n")] if text else []
        if any(len(c) != 1 + len(VIEW_FIELDS) for c in cells):
            raise ValueError("the view script answered a row of another shape")
        columns = dict(zip(("id", *VIEW_FIELDS), zip(*cells, strict=True), strict=False))
        view = build_view(len(cells), columns, float(clock or 0.0), self.settings.sim.cluster.speed)
        view.running = running_attempts(view, _str(running), _str(hists))
        return view

    async def round_inputs(
        self, ids: Sequence[str], families: Sequence[str]
    ) -> tuple[ClusterView, dict[str, Progress], dict[str, FamilyStats]]:
        """`cluster_view`, `workflow_progress(ids)` and `history.stats(families)` in one round
        trip (a pipeline of the three scripts): what a batch's first round reads."""
        if not ids and not families:  # the heuristic's batch: the view alone, no pipeline
            return await self.cluster_view(), {}, {}  # (a pipeline costs twice the CPU)
        pipe = self.redis.pipeline(transaction=False)
        await self._read_view(client=pipe)
        if ids:
            await self._progress(args=[self.prefix, *ids], client=pipe)
        if families:
            await self.history.stats(families, client=pipe)
        res = await pipe.execute()
        view = self._view_from(*res[0])
        progress = _progress_from(ids, res[1]) if ids else {}
        stats = parse_stats(families, res[-1]) if families else {}
        return view, progress, stats

    async def clock(self) -> float:
        """The job-queue clock: the latest event time applied (0 before any)."""
        return float(await self.redis.get(self.key("clock")) or 0.0)

    async def apply_event(self, msg: Any) -> None:
        """Apply one `dagsched.events` message (idempotent: a redelivery changes nothing)."""
        await self.events.apply([msg])

    async def apply_events(self, msgs: Sequence[Any]) -> None:
        """Apply a batch of events in order, in two round trips whatever its size, with the
        same result as applying them one by one (`daemon.event_apply`)."""
        await self.events.apply(msgs)

    async def ledger(self, node: str) -> list[dict[str, str]]:
        """The ledger entries on `node` (for tests and audits)."""
        keys = [_str(k) for k in await self.redis.smembers(self.key("nodeled", node))]
        pipe = self.redis.pipeline(transaction=False)
        for k in keys:
            pipe.hgetall(k)
        return [{a.decode(): b.decode() for a, b in h.items()} for h in await pipe.execute()]


def running_attempts(view: ClusterView, running: str, hists: str) -> RunningAttempts:
    """The view script's running attempts (`run` values: node, compute began, advertised run
    time, escaped family) on `view`'s nodes, with their families' history hashes (a line per
    family: the escaped name, then fields and values), as `sim.snapshot.running_attempts`
    has them (`RunningAttempts.on_nodes`)."""
    ratios: dict[str, float] = {}
    for line in hists.split("\n") if hists else ():
        family, _, row = line.partition("\t")
        if (stats := stats_of_row(row)) is not None:
            ratios[family] = stats.runtime_ratio()
    index = {node: i for i, node in enumerate(view.node_ids)}
    node: list[int] = []
    began: list[float] = []
    advertised: list[float] = []
    ratio: list[float] = []
    for line in running.split("\n") if running else ():
        nid, start, adv, family = line.split("\t", 3)
        i = index.get(nid)
        if i is None:
            continue
        node.append(i)
        began.append(float(start))
        advertised.append(float(adv))
        ratio.append(ratios.get(family, 1.0))
    return RunningAttempts.on_nodes(node, began, advertised, ratio, view.slowdown)


_STATUS = {"r": "r", "q": "q", "x": "dead", "n": "nofit"}  # the decide script's letters
Progress = tuple[set[int], set[int], dict[int, str]]  # done, active, task index -> node


def _progress_from(ids: Sequence[str], text: bytes | str) -> dict[str, Progress]:
    """The progress script's reply, by workflow."""
    out = {}
    for wf_id, line in zip(ids, _str(text).split("\n"), strict=True):
        done, active, nodes = line.split("\t")
        out[wf_id] = (
            {int(x) for x in done.split(",") if x},
            {int(x) for x in active.split(",") if x},
            {int(k): v for k, _, v in (kv.partition("=") for kv in nodes.split(",") if kv)},
        )
    return out


def _str(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


def _bytes(x: bytes | str) -> bytes:
    return x.encode() if isinstance(x, str) else x


def _bytes_list(xs: Sequence[bytes | str | None]) -> list[bytes | None]:
    return [x.encode() if isinstance(x, str) else x for x in xs]


def build_view(
    n: int,
    columns: Mapping[str, Sequence[str]],
    now: float,
    speed: dict[str, dict[str, float]],
) -> ClusterView:
    """A `ClusterView` of `n` nodes from their hash fields, a column of strings per field
    (`id` the node ids; an empty string or a missing column reads as the field's default)."""

    def col(name: str, default: float = 0.0) -> np.ndarray:
        values = columns.get(name)
        if values is None:
            return np.full(n, default, dtype=float)
        return np.array([float(v) if v else default for v in values], dtype=float)

    kinds = [k or "cpu" for k in columns.get("kind", ("",) * n)]
    return ClusterView(
        now=now,
        node_ids=list(columns.get("id", ())),
        kind=np.array([NODE_KINDS.index(k) if k in NODE_KINDS else 0 for k in kinds], dtype=int),
        zone=np.array([int(z) if z else 0 for z in columns.get("zone", ("",) * n)], dtype=int),
        cores=col("cores", 1.0),
        mem_gb=col("mem_gb", 1.0),
        gpu_mem_gb=col("gpu_mem_gb"),
        net_gbps=col("net_gbps", 25.0),
        speed=np.array(
            [[speed.get(k, {}).get(t, 1.0) for t in TASK_TYPE_NAMES] for k in kinds], dtype=float
        ).reshape(n, len(TASK_TYPE_NAMES)),
        alive=np.array([a == "1" for a in columns.get("alive", ("",) * n)], dtype=bool),
        free_cores=col("free_cores"),
        free_mem=col("free_mem"),
        queue_len=col("queue_len"),
        queued_core_s=col("queued_core_s"),
        net_in_bytes=col("net_in_bytes"),
        failure_rate=col("failure_rate"),
        slowdown=col("slowdown", 1.0),
        used_cores=col("used_cores"),
        used_mem=col("used_mem_gb"),
    )
