"""Which scheduler serves each arm, and hot reload from the registry between batches.

A background task watches the registry aliases: a notice on the Redis channel
(`registry.serving.model_channel`) triggers a check at once, and a poll every
`daemon.reload_poll_s` catches notices that were missed. A new version is loaded and verified
off the event loop (`load_alias` runs its checksum and smoke checks) and parked; the batch loop
swaps it in between batches (`swap`). A version that fails its checks is refused and the
current one keeps serving; an unreachable registry keeps the loaded model.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import redis.asyncio as aioredis
import structlog

from dagsched.daemon.metrics import DaemonMetrics
from dagsched.policy.api import Scheduler
from dagsched.policy.heuristic import LeastLoadedScheduler
from dagsched.registry import serving
from dagsched.registry.errors import RegistryError
from dagsched.schemas.ab import workflow_bucket
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

ARMS = ("champion", "challenger")
Loaded = tuple[str, Scheduler]
Loader = Callable[[Settings, str], "Loaded | None"]
VersionOf = Callable[[Settings, str], "str | None"]


def make_fallback(name: str) -> Scheduler:
    """The heuristic that serves when no model can."""
    if name != "least_loaded":
        raise ValueError(f"daemon.fallback_policy: unknown heuristic {name!r} (least_loaded)")
    return LeastLoadedScheduler()


class Models:
    """The serving schedulers per arm plus the fallback; reloaded in the background."""

    def __init__(
        self,
        settings: Settings,
        metrics: DaemonMetrics,
        loader: Loader = serving.load_alias,
        version_of: VersionOf = serving.alias_version,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.loader = loader
        self.version_of = version_of
        self.fallback = make_fallback(settings.daemon.fallback_policy)
        self.serving: dict[str, Loaded | None] = dict.fromkeys(ARMS)
        self._explore: tuple[Scheduler, Scheduler] | None = None  # (served, its sampler)
        self._pending: dict[str, Loaded | None] = {}
        self._refused: dict[str, str] = {}
        self._wake = asyncio.Event()
        self.first_check = asyncio.Event()  # set after the first registry check
        metrics.set_model("fallback", self.fallback.version)

    def version(self, arm: str) -> str | None:
        loaded = self.serving.get(arm)
        return loaded[0] if loaded is not None else None

    def pick(self, task_key: str, attempt: int) -> str:
        """The arm for a task, stable by workflow id (every task and attempt of a workflow
        goes to the same arm): a `challenger_share` slice of workflows when a challenger
        serves, then an `explore_share` slice ("explore"), else the champion."""
        del attempt
        if self.serving["champion"] is None:
            return "fallback"
        d = self.settings.daemon
        bucket = workflow_bucket(task_key.rsplit("/", 1)[0])
        if self.serving["challenger"] is not None and bucket < d.challenger_share:
            return "challenger"
        if d.challenger_share <= bucket < d.challenger_share + d.explore_share:
            return "explore"
        return "champion"

    def scheduler(self, arm: str) -> Scheduler:
        if arm == "explore":
            return self._explorer()
        loaded = self.serving.get(arm)
        return loaded[1] if loaded is not None else self.fallback

    def _explorer(self) -> Scheduler:
        """The challenger (else the champion) sampling its actions: the exploration slice."""
        loaded = self.serving["challenger"] or self.serving["champion"]
        if loaded is None:
            return self.fallback
        from dagsched.policy.scheduler import GNNScheduler  # torch: only where a GNN serves

        sched = loaded[1]
        if not isinstance(sched, GNNScheduler):
            return sched
        if self._explore is None or self._explore[0] is not sched:
            sampler = GNNScheduler(
                sched.model, sched.normalizer, sched.version, deterministic=False
            )
            self._explore = (sched, sampler)
        return self._explore[1]

    def swap(self) -> bool:
        """Install versions loaded since the last batch; True when anything changed."""
        if not self._pending:
            return False
        pending, self._pending = self._pending, {}
        for arm, loaded in pending.items():
            old = self.version(arm)
            self.serving[arm] = loaded
            new = loaded[0] if loaded is not None else None
            log.info("model.swapped", arm=arm, old=old, new=new)
            if new is not None:
                self.metrics.set_model(arm, new)
        return True

    def notify(self) -> None:
        """Check the registry now (called on a pub/sub notice)."""
        self._wake.set()

    async def check(self) -> None:
        """Compare each alias with what serves; load and park a changed version."""
        for arm in ARMS:
            try:
                version = await asyncio.to_thread(self.version_of, self.settings, arm)
            except Exception as exc:  # registry unreachable: keep serving what is loaded
                log.warning("registry.unreachable", arm=arm, error=str(exc))
                return
            current = self._pending[arm] if arm in self._pending else self.serving[arm]
            current_version = current[0] if current is not None else None
            if version == current_version or (version and self._refused.get(arm) == version):
                continue
            if version is None:
                self._pending[arm] = None  # alias removed: that arm stops serving
                continue
            try:
                loaded = await asyncio.to_thread(self.loader, self.settings, arm)
            except RegistryError as exc:
                self._refused[arm] = version
                self.metrics.model_refused.inc()
                log.error("model.refused", arm=arm, version=version, reason=str(exc))
                continue
            except Exception as exc:
                log.warning("registry.load_failed", arm=arm, version=version, error=str(exc))
                continue
            if loaded is not None:
                self._pending[arm] = loaded
                log.info("model.loaded", arm=arm, version=loaded[0])

    async def watch(self, stop: asyncio.Event, redis: aioredis.Redis | None) -> None:
        """Until `stop`: check on every notice and every `reload_poll_s` seconds."""
        listener = asyncio.create_task(self._listen(stop, redis)) if redis is not None else None
        try:
            while not stop.is_set():
                self._wake.clear()  # before the check: a notice during it triggers another
                await self.check()
                self.first_check.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        _first(stop.wait(), self._wake.wait()), self.settings.daemon.reload_poll_s
                    )
        finally:
            if listener is not None:
                listener.cancel()
                with contextlib.suppress(BaseException):
                    await listener

    async def _listen(self, stop: asyncio.Event, redis: aioredis.Redis) -> None:
        channel = serving.model_channel(self.settings)
        backoff = 0.5
        while not stop.is_set():
            pubsub = redis.pubsub()
            try:
                await pubsub.subscribe(channel)
                backoff = 0.5
                while not stop.is_set():
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if msg is not None:
                        log.info("model.notice", data=str(msg.get("data")))
                        self.notify()
            except Exception as exc:  # Redis away: the poll still runs; resubscribe later
                log.debug("model.notice.unavailable", error=str(exc))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), backoff)
                backoff = min(backoff * 2, 10.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()


async def _first(*aws: object) -> None:
    tasks = [asyncio.ensure_future(a) for a in aws]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
