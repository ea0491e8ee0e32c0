"""The daemon's view of cluster state: Redis when it answers, the last known state when not.

While Redis is unreachable the store serves the last `ClusterView` it read, applies this
replica's own reservations to it locally, keeps its decisions and workflows in memory, and
says so (`degraded`, `state_age_s`). What it keeps is bounded by `daemon.caches`: once it
holds as many decisions to write back as it remembers, `backlog_full` says so and the batch
loop holds its input in the broker. When Redis answers again it resyncs: workflows and
decisions made meanwhile are written back (a decision another replica stored first wins and
is logged), then the view is read fresh.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import structlog
from redis.exceptions import RedisError

from dagsched.core.history import FamilySummary, summarize
from dagsched.core.view import ClusterView
from dagsched.core.workflow import Workflow
from dagsched.daemon.redis_state import Progress, RedisState, Reservation
from dagsched.service_config import CacheSettings

log = structlog.get_logger(__name__)

RESYNC_BACKOFF_S = (0.2, 5.0)


class _Lru(OrderedDict[str, Any]):
    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.cap:
            self.popitem(last=False)


class StateStore:
    """Redis-backed state with a local fallback; never raises `RedisError` to the caller."""

    def __init__(
        self,
        redis_state: RedisState,
        parse_workflow: Callable[[bytes], Workflow],
        caches: CacheSettings | None = None,
    ) -> None:
        caches = caches or CacheSettings()
        self.rs = redis_state
        self.parse_workflow = parse_workflow  # raw workflow JSON -> Workflow, validated
        self.degraded = False
        self.last_ok = 0.0  # monotonic time of the last successful Redis read
        self._view: ClusterView | None = None
        self._decisions = _Lru(caches.decisions)
        self.workflows = _Lru(caches.workflows)  # id -> (Workflow, raw message)
        self._pending_wf: dict[str, bytes] = {}
        self._pending_res: list[Reservation] = []
        self._next_try = 0.0
        self._backoff = RESYNC_BACKOFF_S[0]

    # -- health -------------------------------------------------------------------------------

    def state_age_s(self) -> float:
        """Seconds since Redis last answered a read (0 before the first)."""
        return time.monotonic() - self.last_ok if self.last_ok else 0.0

    def backlog_full(self, more: int = 0) -> bool:
        """True while Redis is away and `more` decisions on top of those not yet written back
        would pass what this replica remembers (`daemon.caches.decisions`): they could push
        out a decision a redelivery must get back, so the caller holds its input until Redis
        answers."""
        return self.degraded and len(self._pending_res) + more > self._decisions.cap

    def _down(self, what: str, exc: BaseException) -> None:
        if not self.degraded:
            log.warning("redis.unreachable", op=what, error=str(exc) or type(exc).__name__)
        self.degraded = True
        self._next_try = time.monotonic() + self._backoff
        self._backoff = min(self._backoff * 2, RESYNC_BACKOFF_S[1])

    def _ok(self) -> None:
        self.last_ok = time.monotonic()

    async def maybe_resync(self, now: bool = False) -> None:
        """When degraded and the backoff has passed (or `now`): write back local work, leave
        degraded."""
        if not self.degraded or (time.monotonic() < self._next_try and not now):
            return
        try:
            await self.rs.redis.ping()
            if self._pending_wf:
                await self.rs.put_workflows(list(self._pending_wf.items()))
                self._pending_wf.clear()
            while self._pending_res:
                r = self._pending_res[0]
                status, winner = await self.rs.decide(r, queue_if_full=True, force=True)
                if status == "dup" and winner != r.decision:
                    log.warning("redis.resync.conflict", task=r.task_key, attempt=r.attempt)
                self._pending_res.pop(0)
        except RedisError as exc:
            self._down("resync", exc)
            return
        self.degraded = False
        self._backoff = RESYNC_BACKOFF_S[0]
        self._ok()
        log.info("redis.resynced")

    # -- reads --------------------------------------------------------------------------------

    async def view(self) -> ClusterView | None:
        """The cluster now; the last known one (with local reservations) while degraded."""
        await self.maybe_resync()
        if not self.degraded:
            try:
                self._view = await self.rs.cluster_view()
                self._ok()
            except RedisError as exc:
                self._down("view", exc)
        return _copy(self._view) if self._view is not None else None

    async def round_inputs(
        self, ids: Sequence[str], families: Sequence[str]
    ) -> tuple[ClusterView | None, dict[str, Progress], dict[str, FamilySummary]]:
        """`view()`, `progress(ids)` and `history(families)` in one Redis round trip."""
        await self.maybe_resync()
        if not self.degraded:
            try:
                view, progress, stats = await self.rs.round_inputs(ids, families)
            except RedisError as exc:
                self._down("view", exc)
            else:
                self._view = view
                self._ok()
                history = {f: s for f, st in stats.items() if (s := summarize(st)) is not None}
                return _copy(view), progress, history
        view_ = _copy(self._view) if self._view is not None else None
        return view_, {i: (set(), set(), {}) for i in ids}, {}

    async def clock(self) -> float | None:
        """The job-queue clock in Redis; None while degraded (it cannot move then)."""
        if self.degraded:
            return None
        try:
            return await self.rs.clock()
        except RedisError as exc:
            self._down("clock", exc)
            return None

    async def stored(self, keys: Sequence[tuple[str, int]]) -> list[bytes | None]:
        """Stored decisions by (task key, attempt): Redis, or this replica's memory."""
        local = [self._decisions.get(f"{k}:{a}") for k, a in keys]
        if self.degraded or all(x is not None for x in local):
            return local
        try:
            remote = await self.rs.stored_decisions(keys)
        except RedisError as exc:
            self._down("stored", exc)
            return local
        return [r if r is not None else x for r, x in zip(remote, local, strict=True)]

    async def workflow_lookup(self, ids: Sequence[str]) -> dict[str, Workflow | None]:
        """Workflows by id from the local cache, then Redis (raw JSON parsed by the caller)."""
        out: dict[str, Workflow | None] = {}
        missing = []
        for i in ids:
            hit = self.workflows.get(i)
            if hit is not None:
                out[i] = hit[0]
            else:
                missing.append(i)
        if missing and not self.degraded:
            try:
                raws = await self.rs.get_workflows(missing)
            except RedisError as exc:
                self._down("workflows", exc)
                raws = [None] * len(missing)
            for i, raw in zip(missing, raws, strict=True):
                out[i] = self._parse(i, raw) if raw is not None else None
        for i in missing:
            out.setdefault(i, None)
        return out

    def _parse(self, wf_id: str, raw: bytes) -> Workflow | None:
        try:
            wf = self.parse_workflow(raw)
        except Exception as exc:  # stored by someone else and no longer valid
            log.warning("workflow.unparseable", workflow=wf_id, error=str(exc))
            return None
        self.workflows.put(wf_id, (wf, raw))
        return wf

    async def history(self, families: Sequence[str]) -> dict[str, FamilySummary]:
        """What history says of each family (empty while degraded: the model then sees
        families it knows nothing about, and predicts their declared requests)."""
        if not self.degraded and families:
            try:
                stats = await self.rs.history.stats(families)
                return {f: s for f, st in stats.items() if (s := summarize(st)) is not None}
            except RedisError as exc:
                self._down("history", exc)
        return {}

    async def progress(self, ids: Sequence[str]) -> dict[str, Progress]:
        """Done / active tasks and task nodes per workflow (empty while degraded)."""
        if not self.degraded and ids:
            try:
                return await self.rs.workflow_progress(ids)
            except RedisError as exc:
                self._down("progress", exc)
        return {i: (set(), set(), {}) for i in ids}

    # -- writes -------------------------------------------------------------------------------

    async def put_workflows(self, items: Sequence[tuple[str, Workflow, bytes]]) -> None:
        """Remember workflows locally and in Redis (later, if Redis is away)."""
        for wf_id, wf, raw in items:
            self.workflows.put(wf_id, (wf, raw))
        if self.degraded:
            self._pending_wf.update((i, raw) for i, _, raw in items)
            return
        try:
            await self.rs.put_workflows([(i, raw) for i, _, raw in items])
        except RedisError as exc:
            self._down("put_workflows", exc)
            self._pending_wf.update((i, raw) for i, _, raw in items)

    async def decide(self, r: Reservation, queue_if_full: bool) -> tuple[str, bytes | None]:
        """Store a decision and take its reservation (see `RedisState.decide`)."""
        return (await self.decide_many([(r, queue_if_full)]))[0]

    async def decide_many(
        self, items: Sequence[tuple[Reservation, bool]]
    ) -> list[tuple[str, bytes | None]]:
        """A round's decisions and reservations, in order, in one step (`RedisState.decide_many`);
        each pairs a reservation with whether to queue it when it does not fit."""
        if not items:
            return []
        if not self.degraded:
            try:
                results = await self.rs.decide_many(
                    [(r, "queue" if q else "fit") for r, q in items]
                )
            except RedisError as exc:
                self._down("decide", exc)
            else:
                for (r, _), (status, winner) in zip(items, results, strict=True):
                    if status in ("r", "q"):
                        self._decisions.put(f"{r.task_key}:{r.attempt}", r.decision)
                    elif status == "dup" and winner is not None:
                        self._decisions.put(f"{r.task_key}:{r.attempt}", winner)
                return results
        return [self._decide_locally(r, q) for r, q in items]

    def _decide_locally(self, r: Reservation, queue_if_full: bool) -> tuple[str, bytes | None]:
        key = f"{r.task_key}:{r.attempt}"
        prev = self._decisions.get(key)
        if prev is not None:
            return "dup", prev
        v = self._view
        if v is None or r.node not in v.node_ids:
            return "dead", None
        i = v.node_ids.index(r.node)
        if not v.alive[i]:
            return "dead", None
        if v.free_cores[i] + 1e-9 >= r.cores and v.free_mem[i] + 1e-9 >= r.mem:  # backfill
            v.free_cores[i] -= r.cores
            v.free_mem[i] -= r.mem
            status = "r"
        elif not queue_if_full:
            return "nofit", None
        else:
            v.queue_len[i] += 1
            v.queued_core_s[i] += r.core_s
            status = "q"
        self._decisions.put(key, r.decision)
        self._pending_res.append(r)
        return status, None


def _copy(v: ClusterView) -> ClusterView:
    arrays = {
        name: getattr(v, name).copy()
        for name in ClusterView.__slots__
        if isinstance(getattr(v, name), np.ndarray)
    }
    return replace(v, node_ids=list(v.node_ids), **arrays)
