"""Where `dagsched explain` reads from: the daemon's decision store in Redis and the model
versions that made the decisions (the registry, or bundle folders), run on one thread."""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dagsched.registry.errors import RegistryError
from dagsched.schemas.messages import DecisionLogMsg
from dagsched.settings import Settings

if TYPE_CHECKING:
    from dagsched.policy.scheduler import GNNScheduler

_GLOB = re.compile(r"([*?\[\]\\])")
_DECIDED_AT = re.compile(rb'"decided_at":\s*([0-9.eE+-]+)')


class ExplainFailed(typer.TyperException):
    """A user-fixable problem: printed as one line `error: ...`, exit 2 (see cli.main.run)."""

    exit_code = 2


# -- Redis -----------------------------------------------------------------------------------------


class DecisionStore:
    """Read-only access to the daemon's decision store and decision logs (sync client).

    Keys as `dagsched.daemon.redis_state.RedisState` writes them:
    `{topic_prefix}dagsched:dec:{wf}/{task}:{attempt}` and `...:obs:{wf}/{task}:{attempt}`.
    """

    def __init__(self, settings: Settings) -> None:
        import redis

        self.url = settings.redis_url
        self.prefix = f"{settings.topic_prefix}dagsched:"
        self.redis = redis.Redis.from_url(self.url, socket_connect_timeout=2, socket_timeout=10)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        import redis

        try:
            return fn(*args, **kw)
        except redis.RedisError as exc:
            raise ExplainFailed(f"cannot read Redis at {self.url}: {exc}") from None

    def key(self, kind: str, task_key: str, attempt: int) -> str:
        """The Redis key of a decision (`dec`) or decision log (`obs`)."""
        return f"{self.prefix}{kind}:{task_key}:{attempt}"

    def find(self, task_key: str, attempt: int | None) -> tuple[int, bytes | None, bytes | None]:
        """(attempt, decision-log bytes, decision bytes) of the asked attempt, or of the latest
        stored one (attempts 0, 1, ... until one has neither); ExplainFailed if none."""
        if attempt is not None:
            log, dec = self._call(
                self.redis.mget,
                [self.key("obs", task_key, attempt), self.key("dec", task_key, attempt)],
            )
            if log is None and dec is None:
                raise ExplainFailed(
                    f"unknown task id {task_key!r} attempt {attempt}: no decision stored "
                    f"under {self.prefix}dec:{task_key}:{attempt}"
                )
            return attempt, log, dec
        found: tuple[int, bytes | None, bytes | None] | None = None
        k = 0
        while True:
            log, dec = self._call(
                self.redis.mget, [self.key("obs", task_key, k), self.key("dec", task_key, k)]
            )
            if log is None and dec is None:
                break
            found = (k, log, dec)
            k += 1
        if found is None:
            raise ExplainFailed(
                f"unknown task id {task_key!r}: no decision stored under "
                f"{self.prefix}dec:{task_key}:0"
            )
        return found

    def node_ids(self) -> list[str]:
        """Node ids the cluster view is built from (sorted, as `RedisState.cluster_view`)."""
        raw = self._call(self.redis.smembers, f"{self.prefix}nodes")
        return sorted(x.decode() if isinstance(x, bytes) else str(x) for x in raw)

    def recent_logs(self, n: int) -> tuple[list[DecisionLogMsg], int, int]:
        """The `n` most recent decision logs (by decided_at), how many logs are stored, and how
        many of the chosen ones were unreadable. Streams the values in chunks and keeps only the
        `n` newest raw records, so memory stays bounded however many are stored."""
        pattern = _GLOB.sub(r"\\\1", self.prefix) + "obs:*"
        keys = list(self._call(lambda: list(self.redis.scan_iter(match=pattern, count=1000))))
        newest: list[tuple[float, int, bytes]] = []  # min-heap of (decided_at, seq, raw)
        stored = 0
        for i in range(0, len(keys), 500):
            for raw in self._call(self.redis.mget, keys[i : i + 500]):
                if raw is None:  # expired meanwhile
                    continue
                stored += 1
                m = _DECIDED_AT.search(raw)
                at = float(m[1]) if m else 0.0
                item = (at, stored, raw)
                if len(newest) < n:
                    heapq.heappush(newest, item)
                elif item > newest[0]:
                    heapq.heapreplace(newest, item)
        logs: list[DecisionLogMsg] = []
        bad = 0
        for _, _, raw in sorted(newest, reverse=True):
            try:
                logs.append(DecisionLogMsg.model_validate_json(raw))
            except ValueError:
                bad += 1
        return logs, stored, bad


# -- models ----------------------------------------------------------------------------------------


class Models:
    """The model version that made a decision: from the registry ("v3" -> version 3) or from
    `--model-dir` (a bundle folder, or a folder of bundles named by version)."""

    def __init__(self, settings: Settings, model_dir: Path | None) -> None:
        self.settings = settings
        self.model_dir = model_dir
        self.cache: dict[str, GNNScheduler] = {}
        self.source: dict[str, str] = {}  # version -> where it was loaded from

    def get(self, version: str) -> GNNScheduler:
        """The scheduler of `version`, loaded once (RegistryError when it cannot be)."""
        if version not in self.cache:
            self.cache[version] = self._load(version)
        return self.cache[version]

    def _load(self, version: str) -> GNNScheduler:
        if self.model_dir is not None:
            from dagsched.policy.bundle import BundleError, load_bundle

            base = self.model_dir
            for folder in (base / version, base / version.removeprefix("v"), base):
                if (folder / "checksums.json").is_file():
                    try:
                        sched = load_bundle(folder, version)
                    except BundleError as exc:
                        raise RegistryError(str(exc)) from None
                    self.source[version] = f"bundle {folder}"
                    return sched
            raise RegistryError(f"{base}: no model bundle for version {version!r}")
        m = re.fullmatch(r"v(\d+)", version)
        if m is None:
            raise RegistryError(
                f"model version {version!r} is not a registry version (vN); "
                "pass --model-dir with its bundle"
            )
        from dagsched.registry.store import Registry

        sched = Registry(self.settings).load(m[1])
        self.source[version] = f"registry version {m[1]}"
        return sched


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch intra-op thread while explaining: the batches are small, and on a shared
    2-core machine one thread measured 2-5x faster than two (bench/explain_speed.py); it also
    leaves the other cores to a daemon on the same host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
