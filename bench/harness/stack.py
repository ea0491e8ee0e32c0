"""One bench run's services on this machine: broker, Redis, a temporary home; and provenance."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dagsched.daemon.redis_server import RedisServer
from dagsched.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]  # the repository root: bench/harness/..


@dataclass
class Stack:
    """What `local_stack` set up: settings pointing at it, and where each part came from."""

    settings: Settings  # kafka_bootstrap is the embedded broker's
    home: Path
    prefix: str
    redis_url: str
    private_redis: bool


@contextlib.asynccontextmanager
async def local_stack(
    redis_url: str,
    *,
    name: str,
    keep_home: bool = False,
    say: Callable[[str], Any] = print,
    overrides: dict[str, Any] | None = None,
    private_redis: bool = False,
    bootstrap: str | None = None,
) -> AsyncIterator[Stack]:
    """The broker, Redis and a temporary home for one bench run (see the module docstring).

    Settings: code defaults and configs/default.yaml (no DAGSCHED_* variables), log level
    WARNING, metrics on a free port, then `overrides`. Keys and topics are prefixed
    `bench-{name}-{random}.`; the keys are dropped on exit, and the home removed unless
    `keep_home`. `private_redis` starts a `redis-server` of its own even when `redis_url`
    answers (a bench that measures Redis' memory wants nobody else's keys in it).
    `bootstrap`: use that Kafka instead of the embedded broker (the run's topics are created
    there under the prefix, and left there)."""
    from dagsched.daemon.broker import embedded_broker, ensure_topics

    home = Path(tempfile.mkdtemp(prefix=f"dagsched-{name}-"))
    prefix = f"bench-{name}-{uuid.uuid4().hex[:8]}."
    redis_proc = None
    if private_redis or not redis_answers(redis_url):
        redis_proc = RedisServer().start()
        redis_url = redis_proc.url
    settings = load_settings(
        None,
        {
            "home": str(home),
            "topic_prefix": prefix,
            "redis_url": redis_url,
            "log_level": "WARNING",
            "daemon.metrics_port": 0,
            **(overrides or {}),
        },
        environ={},
    )
    try:
        async with contextlib.AsyncExitStack() as exits:
            if bootstrap is None:  # the embedded broker creates the topics
                bootstrap = (await exits.enter_async_context(embedded_broker(settings))).bootstrap
                s = settings.model_copy(update={"kafka_bootstrap": bootstrap})
            else:
                s = settings.model_copy(update={"kafka_bootstrap": bootstrap})
                await ensure_topics(s)
            say(f"broker {bootstrap}, redis {redis_url}, home {home}")
            yield Stack(s, home, prefix, redis_url, redis_proc is not None)
    finally:
        with contextlib.suppress(Exception):
            drop_redis_keys(redis_url, prefix)
        if redis_proc is not None:
            redis_proc.stop()
        if keep_home:
            say(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)


def redis_answers(url: str) -> bool:
    """Whether a Redis at `url` answers a PING within half a second."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=0.5, socket_timeout=0.5)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def drop_redis_keys(url: str, prefix: str) -> int:
    """Delete every key under `prefix` (a bench's own namespace); return how many."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for i in range(0, len(keys), 500):
            client.delete(*keys[i : i + 500])
        return len(keys)
    finally:
        client.close()


def git_state() -> dict[str, Any]:
    """The commit measured and the files that differed from it (a dirty tree is measured as is)."""

    def git(*argv: str) -> str:
        try:
            done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True)
        except OSError:
            return ""
        return done.stdout.rstrip()

    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "modified": [ln[3:] for ln in git("status", "--porcelain").splitlines() if ln[:2] != "??"],
    }
