"""`dagsched daemon` replicas as separate processes, and what their JSON log lines said."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagsched.settings import Settings
from harness.stack import REPO

_PARTITION = re.compile(r"topic='([^']*)', partition=(\d+)")


def _ts(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Replica:
    """One `dagsched daemon` process and what its log lines said."""

    index: int
    proc: asyncio.subprocess.Process
    log_path: Path
    tasks_topic: str
    assignments: list[tuple[float, frozenset[int]]] = field(default_factory=list)
    swaps: list[tuple[float, str | None, str | None]] = field(default_factory=list)
    loads: list[tuple[float, str]] = field(default_factory=list)
    notices: list[float] = field(default_factory=list)
    problems: list[dict[str, Any]] = field(default_factory=list)
    metrics_port: int | None = None  # where `/metrics` and `/healthz` listen (its log says)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    reader: asyncio.Task[None] | None = None

    @property
    def serving(self) -> str | None:
        """The champion version this replica serves now (its last swap), if any."""
        return self.swaps[-1][2] if self.swaps else None

    @property
    def partitions(self) -> frozenset[int]:
        """The tasks partitions this replica holds now."""
        return self.assignments[-1][1] if self.assignments else frozenset()

    def owner_at(self, t: float) -> frozenset[int]:
        """The tasks partitions this replica held at time `t`."""
        held: frozenset[int] = frozenset()
        for at, parts in self.assignments:
            if at <= t:
                held = parts
        return held

    async def read(self) -> None:
        """Copy the process's stderr to `log_path`, parsing each JSON line (`on_event`)."""
        assert self.proc.stderr is not None
        with self.log_path.open("ab") as out:
            async for line in self.proc.stderr:
                out.write(line)
                try:
                    ev = json.loads(line)
                    t = _ts(ev["timestamp"])
                except (ValueError, KeyError, TypeError):
                    continue
                self.on_event(ev, t)

    def on_event(self, ev: dict[str, Any], t: float) -> None:
        """Record what a log line says: assignments, swaps, loads, notices, problems, the
        metrics port."""
        name = ev.get("event")
        if name == "partitions.assigned":
            parts = frozenset(
                int(p)
                for s in ev.get("partitions", [])
                for topic, p in _PARTITION.findall(s)
                if topic == self.tasks_topic
            )
            self.assignments.append((t, parts))
        elif name == "partitions.revoked":
            self.assignments.append((t, frozenset()))
        elif name == "model.swapped" and ev.get("arm") == "champion":
            self.swaps.append((t, ev.get("old"), ev.get("new")))
        elif name == "model.loaded" and ev.get("arm") == "champion":
            self.loads.append((t, str(ev.get("version"))))
        elif name == "model.notice":
            self.notices.append(t)
        elif name == "daemon.started":
            self.started.set()
        elif name == "metrics.listening":
            self.metrics_port = int(ev["port"])
        elif ev.get("level") in ("warning", "error", "critical"):
            self.problems.append({"at": t, "event": name, "level": ev.get("level")})


def replica_env(index: int, settings: Settings, torch_threads: int | None) -> dict[str, str]:
    """Each replica has its own home (own bundle cache, as on its own host) and reads the
    bench's MLflow store."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(torch_threads)
    env.update(
        {
            "DAGSCHED_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "DAGSCHED_REDIS_URL": settings.redis_url,
            "DAGSCHED_TOPIC_PREFIX": settings.topic_prefix,
            "DAGSCHED_HOME": str(settings.home / f"replica-{index}"),
            "DAGSCHED_MLFLOW_TRACKING_URI": f"sqlite:///{settings.home / 'mlflow.db'}",
            "DAGSCHED_LOG_LEVEL": "INFO",
            "DAGSCHED_LOG_JSON": "true",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            "PYTHONUNBUFFERED": "1",
            "DAGSCHED_REDIS_WAIT_REPLICAS": str(settings.redis_wait_replicas),
            "DAGSCHED_REDIS_WAIT_TIMEOUT_MS": str(settings.redis_wait_timeout_ms),
        }
    )
    if settings.redis_sentinels:
        env["DAGSCHED_REDIS_SENTINELS"] = ",".join(settings.redis_sentinels)
        env["DAGSCHED_REDIS_MASTER_NAME"] = str(settings.redis_master_name)
    return env


async def start_replica(
    index: int,
    settings: Settings,
    logs: Path,
    torch_threads: int | None,
    extra_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Replica:
    """Start replica `index` as `python -m dagsched.cli.main daemon [extra_args]`; its JSON
    log lines (stderr) are read into the `Replica` and copied to `logs/daemon-{index}.log`.
    `env` adds variables (e.g. `DAGSCHED_DAEMON__GRACE_S`) to `replica_env`'s."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dagsched.cli.main",
        "daemon",
        "--metrics-port",
        "0",
        *extra_args,
        cwd=str(REPO),
        env={**replica_env(index, settings, torch_threads), **(env or {})},
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
        limit=1 << 22,
    )
    r = Replica(index, proc, logs / f"daemon-{index}.log", settings.topic("tasks"))
    r.reader = asyncio.create_task(r.read())
    return r


async def stop_replica(r: Replica, timeout: float = 30.0) -> int | None:
    """SIGTERM the replica (SIGKILL after `timeout`), finish reading its log; its exit code."""
    if r.proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            r.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(r.proc.wait(), timeout)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                r.proc.kill()
            await r.proc.wait()
    if r.reader is not None:
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(r.reader, 5)
    return r.proc.returncode


async def wait_until(cond: Any, timeout: float, what: str, replicas: list[Replica]) -> None:
    """Poll `cond()` until true; TimeoutError after `timeout`, RuntimeError if a replica exits."""
    deadline = time.monotonic() + timeout
    while not cond():
        for r in replicas:
            if r.proc.returncode is not None:
                raise RuntimeError(f"daemon {r.index} exited ({r.proc.returncode}): {r.log_path}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.02)  # log lines arrive on the reader tasks
