"""Every Redis client dagsched makes: one server at `redis_url`, or the primary that Redis
Sentinel names.

With `redis_sentinels` set, a client asks the sentinels for `redis_master_name`'s address
before each new connection, and drops its connections when the server it reached turns out to
be a replica (a demoted primary answers writes with READONLY): after a failover the next
command reaches the promoted server, with no restart and no setting changed. The database
number and password still come from `redis_url`; its host and port are not used then.

Clients are built lazily (no socket opens until the first command), so building one never
fails because Redis is away. See docs/operations/redis-failover.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlparse

import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import NoBackoff
from redis.retry import Retry as SyncRetry
from redis.sentinel import Sentinel as SyncSentinel

from dagsched.settings import Settings


@dataclass(frozen=True, slots=True)
class RedisEndpoint:
    """Where Redis is, as the settings say: a URL, or sentinels and a primary's name."""

    url: str
    sentinels: tuple[tuple[str, int], ...] = ()
    master_name: str | None = None

    @classmethod
    def of(cls, settings: Settings) -> RedisEndpoint:
        """The endpoint of `settings` (validated there: sentinels are HOST:PORT)."""
        sentinels = tuple(_host_port(item) for item in settings.redis_sentinels)
        return cls(settings.redis_url, sentinels, settings.redis_master_name)

    @property
    def uses_sentinel(self) -> bool:
        """Whether the primary is found through Sentinel."""
        return bool(self.sentinels)

    def describe(self) -> str:
        """For messages: the URL, or `sentinel NAME via H:P,H:P`."""
        if not self.uses_sentinel:
            return self.url
        where = ",".join(f"{h}:{p}" for h, p in self.sentinels)
        return f"sentinel {self.master_name} via {where}"

    def server_options(self) -> dict[str, Any]:
        """Database number, user and password of the URL (they apply to the Sentinel-named
        primary as well)."""
        parsed = urlparse(self.url)
        out: dict[str, Any] = {}
        path = parsed.path.lstrip("/")
        if path.isdigit():
            out["db"] = int(path)
        if parsed.username:
            out["username"] = unquote(parsed.username)
        if parsed.password:
            out["password"] = unquote(parsed.password)
        return out


def _host_port(item: str) -> tuple[str, int]:
    host, _, port = item.rpartition(":")
    return host.strip("[]"), int(port)


class _SentinelRedis(aioredis.Redis):
    """A primary's client that also closes its sentinel connections when it is closed."""

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        """Close the client, its pool and the sentinel clients behind it."""
        pool = self.connection_pool
        await super().aclose(close_connection_pool)
        manager = getattr(pool, "sentinel_manager", None)
        if manager is not None:
            await manager.aclose()


class _SyncSentinelRedis(redis.Redis):
    """The synchronous counterpart of `_SentinelRedis`."""

    def close(self) -> None:
        """Close the client, its pool and the sentinel clients behind it."""
        pool = self.connection_pool
        super().close()
        manager = getattr(pool, "sentinel_manager", None)
        if manager is not None:
            manager.close()


def async_client(
    settings: Settings, *, timeout_s: float | None = None, fail_fast: bool = False
) -> aioredis.Redis:
    """An asyncio client of the primary. `timeout_s` bounds connects and replies (None: no
    bound); `fail_fast` turns off redis-py's retries, for callers that degrade instead of
    waiting (the daemon)."""
    end = RedisEndpoint.of(settings)
    opts: dict[str, Any] = {}
    if timeout_s is not None:
        opts.update(socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    if fail_fast:
        opts.update(retry=Retry(NoBackoff(), 1), health_check_interval=0)
    if not end.uses_sentinel:
        return aioredis.from_url(end.url, **opts)
    sentinel_opts = {k: v for k, v in opts.items() if k.startswith("socket_")}
    manager = AsyncSentinel(
        list(end.sentinels), sentinel_kwargs=sentinel_opts or None, **end.server_options()
    )
    assert end.master_name is not None  # the settings require it with sentinels
    return manager.master_for(end.master_name, redis_class=_SentinelRedis, **opts)


def sync_client(
    settings: Settings, *, connect_timeout_s: float = 2.0, timeout_s: float = 10.0
) -> redis.Redis:
    """A synchronous client of the primary (the CLI, the promoter's notices)."""
    end = RedisEndpoint.of(settings)
    opts: dict[str, Any] = {
        "socket_connect_timeout": connect_timeout_s,
        "socket_timeout": timeout_s,
    }
    if not end.uses_sentinel:
        return redis.Redis.from_url(end.url, **opts)
    manager = SyncSentinel(list(end.sentinels), sentinel_kwargs=opts, **end.server_options())
    assert end.master_name is not None
    return manager.master_for(
        end.master_name, redis_class=_SyncSentinelRedis, retry=SyncRetry(NoBackoff(), 1), **opts
    )


def describe(settings: Settings) -> str:
    """Where the settings point Redis, for log lines and errors."""
    return RedisEndpoint.of(settings).describe()
