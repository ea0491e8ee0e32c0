"""The chaos bench's stack, every part a process it can take away: Tansu on a fixed port, a
`redis-server` with an AOF on a fixed port, optionally an `mlflow server`, two `dagsched daemon`
replicas, a `dagsched learner` and a `dagsched evaluator`, all as users run them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dagsched.daemon.broker import TansuBroker, ensure_topics, free_port
from dagsched.daemon.redis_sentinel import RedisProcess, poll
from dagsched.settings import Settings, load_settings
from harness.replicas import Replica, replica_env, start_replica, stop_replica
from harness.stack import REPO


class MlflowServer:
    """`mlflow server` on a loopback port over a SQLite store and a file artifact root."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        """The tracking URI clients use."""
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 300.0) -> MlflowServer:
        """Start the server; return once `/health` answers."""
        self.home.mkdir(parents=True, exist_ok=True)
        log = (self.home / "mlflow-server.log").open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable, "-m", "mlflow", "server",
                "--backend-store-uri", f"sqlite:///{self.home / 'mlflow.db'}",
                "--default-artifact-root", (self.home / "artifacts").as_uri(),
                "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
            ],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            # no job runner and its queue consumers: half a dozen processes the registry
            # does not need, and minutes of start-up on a busy machine
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                 "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )  # fmt: skip
        log.close()

        def healthy() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited: see {self.home / 'mlflow-server.log'}")
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as r:
                return bool(r.status == 200)

        poll(healthy, timeout, "the MLflow server")
        return self

    def stop(self) -> None:
        """Stop the server and its workers (its own process group)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@dataclass
class Service:
    """A learner or evaluator process."""

    name: str
    proc: asyncio.subprocess.Process

    @property
    def alive(self) -> bool:
        """Whether it still runs."""
        return self.proc.returncode is None


@dataclass
class Stack:
    """Every process of the chaos run, and how to (re)start each."""

    home: Path
    settings: Settings
    redis: RedisProcess
    broker: TansuBroker
    mlflow: MlflowServer | None
    registry: bool
    daemons: list[Replica] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)
    others: list[Service] = field(default_factory=list)
    restarts: dict[str, int] = field(default_factory=dict)

    def env(self, index: int) -> dict[str, str]:
        """What every dagsched process of the stack gets (a home of its own each)."""
        env = replica_env(index, self.settings, 1)
        if self.mlflow is not None:
            env["DAGSCHED_MLFLOW_TRACKING_URI"] = self.mlflow.uri
        env["DAGSCHED_DAEMON__GRACE_S"] = "60"  # serve the model from the first batch
        return env

    async def start_daemon(self, i: int) -> Replica:
        """Start (or restart) replica `i` on a fresh metrics port."""
        port = free_port()
        extra = ("--metrics-port", str(port)) + (() if self.registry else ("--no-registry",))
        r = await start_replica(i, self.settings, self.home, 1, extra, env=self.env(i))
        if i < len(self.daemons):
            self.daemons[i], self.ports[i] = r, port
            self.restarts[f"daemon-{i}"] = self.restarts.get(f"daemon-{i}", 0) + 1
        else:
            self.daemons.append(r)
            self.ports.append(port)
        return r

    async def start_service(self, name: str) -> Service:
        """`dagsched learner` or `dagsched evaluator`, its stderr in `home/{name}.log`."""
        log = (self.home / f"{name}.log").open("ab")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "dagsched.cli.main", name,
            cwd=str(REPO), env=self.env(10 + len(self.others)),
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
        )  # fmt: skip
        log.close()
        svc = Service(name, proc)
        self.others.append(svc)
        return svc

    def health(self, i: int) -> dict[str, Any] | None:
        """Replica `i`'s `/healthz`, or None when it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.ports[i]}/healthz", timeout=2
            ) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except Exception:  # not listening (yet, or any more)
            return None

    def alive(self) -> dict[str, bool]:
        """Which processes run now."""
        out = {f"daemon-{r.index}": r.proc.returncode is None for r in self.daemons}
        out.update({s.name: s.alive for s in self.others})
        out["redis"] = self.redis.alive
        out["broker"] = self.broker.proc is not None and self.broker.proc.poll() is None
        if self.mlflow is not None:
            out["mlflow"] = self.mlflow.proc is not None and self.mlflow.proc.poll() is None
        return out

    async def restart_broker(self) -> None:
        """Start Tansu again on its port and create the topics (it comes back empty)."""
        await asyncio.to_thread(self.broker.start)
        deadline = time.monotonic() + 30
        while True:
            try:
                await ensure_topics(self.settings)
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Stop everything this stack started."""

        async def stop(s: Service) -> None:
            if s.proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    s.proc.send_signal(signal.SIGTERM)
                try:
                    await asyncio.wait_for(s.proc.wait(), 20)
                except TimeoutError:
                    s.proc.kill()
                    await s.proc.wait()

        await asyncio.gather(
            *(stop_replica(r, 20) for r in self.daemons),
            *(stop(s) for s in self.others),
            return_exceptions=True,
        )
        if self.mlflow is not None:
            self.mlflow.stop()
        self.broker.stop()
        self.redis.stop()


async def build(home: Path, *, with_mlflow: bool, registry: bool, say: Any) -> Stack:
    """Start Redis (AOF), the broker, MLflow (a server, or SQLite under `home`), register
    the shipped champion and a second version of it (for a promotion)."""
    redis = await asyncio.to_thread(RedisProcess(home / "redis", appendonly=True).start)
    broker = TansuBroker(log=home / "tansu.log").spawn()  # in the loop's thread: see `spawn`
    await asyncio.to_thread(broker.until_listening)
    mlflow = await asyncio.to_thread(MlflowServer(home / "mlflow").start) if with_mlflow else None
    s = load_settings(
        None,
        {
            "home": str(home),
            "topic_prefix": "chaos.",
            "redis_url": redis.url,
            "kafka_bootstrap": broker.bootstrap,
            "mlflow_tracking_uri": mlflow.uri if mlflow is not None else None,
            "log_level": "WARNING",
        },
        environ={},
    )
    await ensure_topics(s)
    where = mlflow.uri if mlflow is not None else "sqlite"
    say(f"broker {broker.bootstrap}, redis {redis.url} (AOF), mlflow {where}")
    stack = Stack(home, s, redis, broker, mlflow, registry)
    if registry or with_mlflow:
        await asyncio.to_thread(_register, s)
    elif not (home / "mlflow.db").exists():
        # the store exists before the services start (the learner and the evaluator would
        # otherwise both create its tables at once)
        await asyncio.to_thread(_create_store, s)
    return stack


def _create_store(s: Settings) -> None:
    from dagsched.registry.store import Registry

    Registry(s).client.search_registered_models()


def _register(s: Settings) -> None:
    from dagsched.registry.store import SHIPPED_CHAMPION, Registry

    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    reg = Registry(s)
    reg.ensure_champion()
    parent = reg.alias_version("champion")
    with reg.run("chaos", {}) as run:
        reg.register_bundle(SHIPPED_CHAMPION, run.run_id, metrics={}, parent=parent, data="chaos")
