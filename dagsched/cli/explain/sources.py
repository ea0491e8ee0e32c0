"""Where `dagsched explain` reads from: the daemon's decision store in Redis and the model
versions that made the decisions (the registry, or bundle folders), run on one thread."""

from __future__ import annotations

import heapq
import json
import re
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dagsched.registry.errors import RegistryError
from dagsched.schemas.messages import DecisionLogMsg
from dagsched.settings import Settings

if TYPE_CHECKING:
    from dagsched.core.workflow import Workflow
    from dagsched.learner.decision_log import LoggedDecision
    from dagsched.policy.scheduler import GNNScheduler

# how far around a decision's decided_at its log record is searched (clocks of the daemon
# host and Redis may differ a little; the record is written when its batch ends)
SEARCH_BEFORE_MS, SEARCH_AFTER_MS = 10_000, 120_000


class ExplainFailed(typer.TyperException):
    """A user-fixable problem: printed as one line `error: ...`, exit 2 (see cli.main.run)."""

    exit_code = 2


# -- Redis -----------------------------------------------------------------------------------------


class DecisionStore:
    """Read-only access to the daemon's decision store and decision logs (sync client).

    Keys as `dagsched.daemon.redis_state.RedisState` writes them: decisions under
    `{topic_prefix}dagsched:dec:{wf}/{task}:{attempt}`; the decision log in the streams
    `...:declog:keys` (per policy call, its new decisions' keys) and `...:declog:recs` (its
    `decision_batch`, zlib, same id), whose observations are replayed with the workflows
    (`...:wf:{id}`). Every log comes out as a `DecisionLogMsg` with its observation.
    """

    def __init__(self, settings: Settings) -> None:
        from dagsched.redis_connect import describe, sync_client

        self.url = describe(settings)
        self.prefix = f"{settings.topic_prefix}dagsched:"
        self.redis = sync_client(settings, connect_timeout_s=2, timeout_s=10)

    def _call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        import redis

        try:
            return fn(*args, **kw)
        except redis.RedisError as exc:
            raise ExplainFailed(f"cannot read Redis at {self.url}: {exc}") from None

    def key(self, task_key: str, attempt: int) -> str:
        """The Redis key of a decision."""
        return f"{self.prefix}dec:{task_key}:{attempt}"

    def find(self, task_key: str, attempt: int | None) -> tuple[int, bytes | None, bytes]:
        """(attempt, decision-log bytes or None, decision bytes) of the asked attempt, or of
        the latest stored one (attempts 0, 1, ... until one is missing); ExplainFailed if
        none. The log is None when it is not kept any more, or for the fallback's decisions."""
        if attempt is not None:
            dec = self._call(self.redis.get, self.key(task_key, attempt))
            if dec is None:
                raise ExplainFailed(
                    f"unknown task id {task_key!r} attempt {attempt}: no decision stored "
                    f"under {self.key(task_key, attempt)}"
                )
            return attempt, self._batch_log(task_key, attempt, dec), dec
        found: tuple[int, bytes] | None = None
        k = 0
        while (dec := self._call(self.redis.get, self.key(task_key, k))) is not None:
            found = (k, dec)
            k += 1
        if found is None:
            raise ExplainFailed(
                f"unknown task id {task_key!r}: no decision stored under {self.key(task_key, 0)}"
            )
        k, dec = found
        return k, self._batch_log(task_key, k, dec), dec

    def _batch_log(self, task_key: str, attempt: int, dec: bytes) -> bytes | None:
        """The decision's log from the decision-log streams, as `decision_log` JSON: the
        record whose keys name it, searched from a little before its `decided_at`."""
        try:
            d = json.loads(dec)
            at_ms, arm = int(float(d["decided_at"]) * 1000), d["arm"]
        except (ValueError, KeyError, TypeError):
            return None
        if arm == "fallback":
            return None  # nothing to replay: the command says who placed it
        token = f"{task_key}:{attempt}".encode()
        start, end = str(max(0, at_ms - SEARCH_BEFORE_MS)), str(at_ms + SEARCH_AFTER_MS)
        keys, recs = self.prefix + "declog:keys", self.prefix + "declog:recs"
        while True:
            chunk = self._call(self.redis.xrange, keys, min=start, max=end, count=500)
            if not chunk:
                return None
            for entry_id, fields in chunk:
                if token in fields.get(b"k", b"").split():
                    return self._replayed(recs, entry_id, (task_key, attempt))
            start = b"(" + chunk[-1][0]

    def _replayed(self, recs: str, entry_id: bytes, key: tuple[str, int]) -> bytes | None:
        got = self._call(self.redis.xrange, recs, min=entry_id, max=entry_id)
        if not got:
            return None  # trimmed meanwhile
        for d in self._decisions(got[0][1].get(b"r", b"")):
            if d.key == key:
                wfs = self.workflows(d.workflow_ids)
                return d.as_message(wfs.get).encode()
        return None

    def _decisions(self, packed: bytes) -> list[LoggedDecision]:
        """The decisions of one stored `decision_batch` ([] when unreadable)."""
        from dagsched.learner.decision_log import logged
        from dagsched.schemas.messages import DecisionBatchMsg

        try:
            return logged(DecisionBatchMsg.model_validate_json(zlib.decompress(packed)))
        except (ValueError, zlib.error):
            return []

    def workflows(self, ids: set[str]) -> dict[str, Workflow]:
        """The stored workflows among `ids` (to replay observations with)."""
        from dagsched.core.wire import to_workflow
        from dagsched.schemas.messages import WorkflowMsg

        order = sorted(ids)
        raws = self._call(self.redis.mget, [f"{self.prefix}wf:{i}" for i in order]) if ids else []
        out: dict[str, Workflow] = {}
        for wf_id, raw in zip(order, raws, strict=True):
            if raw is not None:
                try:
                    out[wf_id] = to_workflow(WorkflowMsg.model_validate_json(raw), 10**9)
                except ValueError:
                    continue
        return out

    def node_ids(self) -> list[str]:
        """Node ids the cluster view is built from (sorted, as `RedisState.cluster_view`)."""
        raw = self._call(self.redis.smembers, f"{self.prefix}nodes")
        return sorted(x.decode() if isinstance(x, bytes) else str(x) for x in raw)

    def recent_logs(self, n: int) -> tuple[list[DecisionLogMsg], int, int]:
        """The `n` most recent decision logs (by decided_at), how many logs are stored, and how
        many of the chosen ones were unreadable. Reads the decision-log records newest first,
        keeping only the `n` newest decisions, so memory stays bounded however many are stored
        (the small keys stream is counted whole)."""
        newest: list[tuple[float, int, LoggedDecision]] = []  # min-heap (decided_at, seq, log)
        seq = 0

        def offer(at: float, item: LoggedDecision) -> bool:
            nonlocal seq
            seq += 1
            if len(newest) < n:
                heapq.heappush(newest, (at, seq, item))
                return True
            if (at, seq) > newest[0][:2]:
                heapq.heapreplace(newest, (at, seq, item))
                return True
            return False

        stored = self._count_stream()
        end = "+"
        recs = self.prefix + "declog:recs"
        while True:  # newest records first, until they are older than all n kept
            chunk = self._call(self.redis.xrevrange, recs, max=end, min="-", count=50)
            if not chunk:
                break
            kept = False
            for _, fields in chunk:
                for d in reversed(self._decisions(fields.get(b"r", b""))):
                    kept = offer(d.decided_at, d) or kept
            if not kept and len(newest) >= n:
                break
            end = b"(" + chunk[-1][0]
        chosen = sorted(newest, key=lambda x: x[:2], reverse=True)
        wfs = self.workflows({w for _, _, x in chosen for w in x.workflow_ids})
        logs: list[DecisionLogMsg] = []
        bad = 0
        for _, _, item in chosen:
            try:
                logs.append(item.as_message(wfs.get))
            except ValueError:
                bad += 1
        return logs, stored, bad

    def _count_stream(self) -> int:
        """How many decisions the decision-log streams hold (their keys, counted)."""
        keys, start, count = self.prefix + "declog:keys", "-", 0
        while chunk := self._call(self.redis.xrange, keys, min=start, max="+", count=2000):
            count += sum(len(f.get(b"k", b"").split()) for _, f in chunk)
            start = b"(" + chunk[-1][0]
        return count


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
