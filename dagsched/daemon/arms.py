"""Which scheduler serves each arm, and hot reload from the registry between batches.

A background task watches the registry aliases: a notice on the Redis channel
(`registry.serving.model_channel`) triggers a check at once, and a poll every
`daemon.reload_poll_s` catches notices that were missed. A new version is loaded and verified
off the event loop (`load_alias` runs its checksum and smoke checks), warmed on batches of
serving's shapes (`daemon.warmup`) and parked; the batch loop swaps it in between batches
(`swap`), so its first batch is decided at its warm speed. A version that fails its checks is
refused and the current one keeps serving; an unreachable registry keeps the loaded model.

Four aliases are watched: `champion` and `challenger` serve the A/B arms; `shadow` (the
learner's latest version while a challenger is under test, `learner.keep_learning`) serves
only the exploration slice, and only while it is of the serving champion's lineage (its
`parent` tag, read when it is loaded, names that champion); `holdback` (the old champion
while the guardrail watches a new one) serves the holdback slice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import redis.asyncio as aioredis
import structlog

from dagsched.core.scheduler import Scheduler
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.warmup import warm_up
from dagsched.policy.heuristic import LeastLoadedScheduler
from dagsched.registry import serving
from dagsched.registry.errors import RegistryError
from dagsched.schemas.ab import slice_arm, workflow_bucket
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

ARMS = ("champion", "challenger", "holdback")
ALIASES = (*ARMS, "shadow")  # what `check` watches; the shadow serves the explore arm only
Loaded = tuple[str, Scheduler]
Loader = Callable[[Settings, str], "Loaded | None"]
VersionOf = Callable[[Settings, str], "str | None"]
ParentOf = Callable[[Settings, str], "str | None"]


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
        parent_of: ParentOf = serving.parent_version,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.loader = loader
        self.version_of = version_of
        self.parent_of = parent_of
        self.fallback = make_fallback(settings.daemon.fallback_policy)
        self.serving: dict[str, Loaded | None] = dict.fromkeys(ALIASES)
        self.shadow_parent: str | None = None  # the serving shadow's champion ("v3")
        self._explore: tuple[Scheduler, Scheduler] | None = None  # (served, its sampler)
        self._pending: dict[str, Loaded | None] = {}
        self._pending_parent: str | None = None
        self._refused: dict[str, str] = {}
        self._wake = asyncio.Event()
        self.first_check = asyncio.Event()  # set after the first registry check
        self.installed = asyncio.Event()  # and what it loaded is swapped in: it serves
        # warm-up seconds of each version serving or waiting to (`/healthz` shows them): a
        # version is warmed before it is parked, so before it serves
        self.warmed: dict[str, float] = {}
        metrics.set_model("fallback", self.fallback.version)

    def version(self, arm: str) -> str | None:
        loaded = self.serving.get(arm)
        return loaded[0] if loaded is not None else None

    def pick(self, task_key: str, attempt: int) -> str:
        """The arm for a task, stable by workflow id (every task and attempt of a workflow
        goes to the same arm): a `challenger_share` slice of workflows when a challenger
        serves, then an `explore_share` slice ("explore"), then a `holdback_share` slice
        when an old champion is held back, else the champion."""
        del attempt
        if self.serving["champion"] is None:
            return "fallback"
        d = self.settings.daemon
        return slice_arm(
            workflow_bucket(task_key.rsplit("/", 1)[0]),
            d.challenger_share,
            d.explore_share,
            d.holdback_share,
            challenger=self.serving["challenger"] is not None,
            holdback=self.serving["holdback"] is not None,
        )

    def scheduler(self, arm: str) -> Scheduler:
        if arm == "explore":
            return self._explorer()
        loaded = self.serving.get(arm)
        return loaded[1] if loaded is not None else self.fallback

    def explore_source(self) -> Loaded | None:
        """What the exploration slice samples from: the shadow while it is of the serving
        champion's lineage, else the challenger, else the champion."""
        shadow, champion = self.serving["shadow"], self.serving["champion"]
        if shadow is not None and champion is not None and self.shadow_parent == champion[0]:
            return shadow
        return self.serving["challenger"] or champion

    def _explorer(self) -> Scheduler:
        """`explore_source` sampling its actions: the exploration slice."""
        loaded = self.explore_source()
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
            self._explore = (sched, self._bounded(sampler))
        return self._explore[1]

    def _bounded(self, sched: Scheduler) -> Scheduler:
        """`sched` with its caches bounded by `daemon.caches` (a model's: the heuristics keep
        none across batches)."""
        bound = getattr(sched, "bound_caches", None)
        if bound is not None:
            caches = self.settings.daemon.caches
            bound(caches.dag_rows, caches.encoding_rows)
        return sched

    def swap(self) -> bool:
        """Install versions loaded since the last batch; True when anything changed. Once the
        first registry check's result is installed, `installed` is set."""
        pending, self._pending = self._pending, {}
        if "shadow" in pending:
            self.shadow_parent = self._pending_parent
        for arm, loaded in pending.items():
            old = self.version(arm)
            self.serving[arm] = loaded
            new = loaded[0] if loaded is not None else None
            log.info("model.swapped", arm=arm, old=old, new=new)
            self.metrics.set_model(arm, new)
        if pending:
            loaded_now = [*self.serving.values(), *self._pending.values()]
            keep = {self.fallback.version} | {x[0] for x in loaded_now if x is not None}
            for version in set(self.warmed) - keep:
                del self.warmed[version]
                self.metrics.set_warmup(version, None)
        if self.first_check.is_set():
            self.installed.set()
        return bool(pending)

    async def warm_fallback(self) -> None:
        """Warm the heuristic: it serves whatever no model can."""
        await self.warm("fallback", (self.fallback.version, self.fallback))

    async def warm(self, arm: str, loaded: Loaded) -> None:
        """Run `loaded`'s scheduler through the warm-up batches (`daemon.warmup`) off the
        event loop; its time goes to `warmed` and `dagsched_warmup_seconds`. A failure is
        logged, not refused: the bundle's smoke test refuses, and serving falls back on a
        model's error."""
        version, sched = loaded
        try:
            seconds = await asyncio.to_thread(warm_up, sched, self.settings)
        except Exception as exc:
            log.warning("model.warmup_failed", arm=arm, version=version, error=str(exc))
            return
        self.warmed[version] = seconds
        self.metrics.set_warmup(version, seconds)
        log.info("model.warmed", arm=arm, version=version, seconds=round(seconds, 3))

    def notify(self) -> None:
        """Check the registry now (called on a pub/sub notice)."""
        self._wake.set()

    async def check(self) -> None:
        """Compare each alias with what serves; load and park a changed version (with the
        shadow's, its lineage: the champion it was fine-tuned from)."""
        for arm in ALIASES:
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
                if arm == "shadow":
                    self._pending_parent = None
                continue
            parent: str | None = None
            try:
                loaded = await asyncio.to_thread(self.loader, self.settings, arm)
                if arm == "shadow" and loaded is not None:
                    parent = await asyncio.to_thread(self.parent_of, self.settings, loaded[0])
            except RegistryError as exc:
                self._refused[arm] = version
                self.metrics.model_refused.inc()
                log.error("model.refused", arm=arm, version=version, reason=str(exc))
                continue
            except Exception as exc:
                log.warning("registry.load_failed", arm=arm, version=version, error=str(exc))
                continue
            if loaded is not None:
                self._bounded(loaded[1])
                await self.warm(arm, loaded)  # parked warm: it serves warm from its first batch
                self._pending[arm] = loaded
                if arm == "shadow":
                    self._pending_parent = parent
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
