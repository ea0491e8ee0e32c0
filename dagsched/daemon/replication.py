"""Wait for Redis replicas before a batch's decisions leave the daemon (`redis_wait_replicas`).

Redis replicates asynchronously: a primary that dies can take its last writes with it, and the
replica that Sentinel promotes then lacks decisions that were already sent. A task redelivered
after that would be decided again, perhaps differently. Waiting until `n` replicas acknowledge
everything written so far, before the batch's outputs are produced, closes that window: a
decision anyone could have read is on `n + 1` servers.

WAIT counts the writes of the connection it runs on, so the fence writes one key on that same
connection first: its replication offset covers every write the primary took before it,
whichever connection made them (the replication stream is one ordered log).

A replica that does not answer within `redis_wait_timeout_ms` does not stop the daemon: the
batch goes on, the shortfall is logged and counted (`wait_short` in /healthz). Durability
then falls back to asynchronous replication until the replica is back; availability wins.
"""

from __future__ import annotations

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError

from dagsched.settings import Settings

log = structlog.get_logger(__name__)


class ReplicaWait:
    """`await fence()` returns once `redis_wait_replicas` replicas hold every write so far (or
    the timeout passed: False)."""

    def __init__(self, redis: Redis, settings: Settings, stats: dict[str, int]) -> None:
        self.redis = redis
        self.replicas = settings.redis_wait_replicas
        self.timeout_ms = settings.redis_wait_timeout_ms
        self.key = f"{settings.topic_prefix}dagsched:fence"
        self.stats = stats
        self._short = False  # log a shortfall once, not once per batch

    async def __call__(self) -> bool:
        """Fence and wait; whether enough replicas acknowledged in time."""
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.incr(self.key)
                pipe.execute_command("WAIT", self.replicas, self.timeout_ms)
                _, acked = await pipe.execute()
        except RedisError as exc:  # Redis away: the state store degrades on its own calls
            self._shortfall(0, str(exc))
            return False
        if int(acked) < self.replicas:
            self._shortfall(int(acked), "timeout")
            return False
        if self._short:
            log.info("redis.replicas_back", replicas=int(acked))
            self._short = False
        return True

    def _shortfall(self, acked: int, why: str) -> None:
        self.stats["wait_short"] += 1
        if not self._short:
            log.warning(
                "redis.replicas_short",
                wanted=self.replicas,
                acked=acked,
                reason=why,
                timeout_ms=self.timeout_ms,
            )
            self._short = True
