"""Redis servers that tests and benchmarks take away: one server with its data on disk (AOF),
and a Sentinel set (a primary, a replica, three sentinels) on free loopback ports.

Every process is the `redis-server` binary the rest of the suite uses (`redis_binary`):
a sentinel is `redis-server CONFIG --sentinel`. Readiness is read from the servers themselves
(PING, `INFO replication`, `SENTINEL MASTER`), polled until they say so.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dagsched.daemon.broker import free_port
from dagsched.daemon.redis_binary import INSTALL_HINT, find_redis_server

MASTER_NAME = "dagsched"
POLL_S = 0.05


def _binary() -> str:
    binary = find_redis_server()
    if binary is None:
        raise RuntimeError(f"no redis-server found: run `make setup`, or {INSTALL_HINT}")
    return binary


def poll(
    cond: Callable[[], Any], timeout: float, what: str, fatal: type[Exception] | None = None
) -> Any:
    """Call `cond` until it returns something truthy (errors count as not yet, but `fatal`)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = cond()
        except Exception as exc:  # a server not listening yet
            if fatal is not None and isinstance(exc, fatal):
                raise
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(POLL_S)  # another process's state: nothing to await


class RedisProcess:
    """One `redis-server` on a fixed loopback port, with its data in `folder`.

    `appendonly`: an AOF fsynced every second, so a stop (SIGTERM or SIGSTOP) and a restart
    keep the data; `wipe()` before `start()` makes the restart empty."""

    def __init__(
        self,
        folder: Path,
        *,
        port: int | None = None,
        appendonly: bool = False,
        replica_of: int | None = None,
        extra: tuple[str, ...] = (),
    ) -> None:
        self.port = port or free_port()
        self.folder = folder
        self.appendonly = appendonly
        self.replica_of = replica_of
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The server's URL (database 0)."""
        return f"redis://127.0.0.1:{self.port}/0"

    def argv(self) -> list[str]:
        """The command line that starts this server."""
        argv = [_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--dir", str(self.folder), "--appendonly", "yes" if self.appendonly else "no"]
        if self.replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(self.replica_of)]
        return argv + list(self.extra)

    def client(self, timeout: float = 0.5) -> Any:
        """A synchronous client of this server."""
        import redis

        return redis.Redis(port=self.port, socket_connect_timeout=timeout, socket_timeout=timeout)

    def start(self, timeout: float = 20.0) -> RedisProcess:
        """Start the server and return once it answers PING (and has loaded its data)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        client = self.client()
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"redis-server on {self.port} exited")
            return bool(client.ping())

        try:
            poll(up, timeout, f"redis-server on {self.port}", fatal=RuntimeError)
            return self
        finally:
            client.close()

    @property
    def alive(self) -> bool:
        """Whether the process runs (a stopped one counts as running)."""
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        """Send `sig` to the server (SIGSTOP / SIGCONT pause and resume it)."""
        if self.proc is not None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: whatever is not on disk is gone."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def stop(self) -> None:
        """SIGTERM (the AOF is flushed), then wait for the exit."""
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGCONT)  # a paused server cannot exit
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None

    def wipe(self) -> None:
        """Delete the data files (the next start is empty)."""
        for path in self.folder.glob("*"):
            if path.is_dir():
                for inner in path.glob("*"):
                    inner.unlink()
                path.rmdir()
            else:
                path.unlink()


class SentinelSet:
    """A primary, a replica and three sentinels (quorum 2) on free loopback ports.

    `down_after_ms` is how long the sentinels wait before they call the primary down; a
    failover then takes about that plus an election (a few seconds in all)."""

    def __init__(
        self, folder: Path | None = None, *, down_after_ms: int = 1000, sentinels: int = 3
    ) -> None:
        self._tmp = None if folder is not None else tempfile.TemporaryDirectory(prefix="sentinel-")
        self.folder = folder or Path(self._tmp.name)  # type: ignore[union-attr]
        self.primary = RedisProcess(self.folder / "primary")
        self.replica = RedisProcess(self.folder / "replica", replica_of=self.primary.port)
        self.down_after_ms = down_after_ms
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinels: list[subprocess.Popen[bytes]] = []

    @property
    def addresses(self) -> list[str]:
        """The sentinels as HOST:PORT (the `redis_sentinels` setting)."""
        return [f"127.0.0.1:{p}" for p in self.sentinel_ports]

    def overrides(self) -> dict[str, Any]:
        """Settings that point a service at this set."""
        return {
            "redis_url": "redis://127.0.0.1:1/0",  # only its database number is used
            "redis_sentinels": self.addresses,
            "redis_master_name": MASTER_NAME,
        }

    def _sentinel_conf(self, port: int) -> Path:
        folder = self.folder / f"sentinel-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "sentinel.conf"
        conf.write_text(
            "\n".join(
                [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f"dir {folder}",
                    f"sentinel monitor {MASTER_NAME} 127.0.0.1 {self.primary.port} 2",
                    f"sentinel down-after-milliseconds {MASTER_NAME} {self.down_after_ms}",
                    f"sentinel failover-timeout {MASTER_NAME} 10000",
                    f"sentinel parallel-syncs {MASTER_NAME} 1",
                    "",
                ]
            )
        )
        return conf

    def start(self, timeout: float = 30.0) -> SentinelSet:
        """Start every process; return once the replica is in sync and every sentinel sees
        the primary, the replica and the other sentinels."""
        self.primary.start()
        self.replica.start()
        for port in self.sentinel_ports:
            self.sentinels.append(
                subprocess.Popen(
                    [_binary(), str(self._sentinel_conf(port)), "--sentinel"],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        replica = self.replica.client()
        try:
            poll(
                lambda: replica.info("replication").get("master_link_status") == "up",
                timeout,
                "the replica to sync",
            )
        finally:
            replica.close()
        others = len(self.sentinel_ports) - 1
        for port in self.sentinel_ports:
            client = self._sentinel(port)

            def sees_all(c: Any = client) -> bool:
                m = c.sentinel_master(MASTER_NAME)
                return bool(m["num-slaves"] >= 1 and m["num-other-sentinels"] >= others)

            try:
                poll(sees_all, timeout, f"sentinel {port} to see the set")
            finally:
                client.close()
        return self

    def _sentinel(self, port: int) -> Any:
        import redis

        return redis.Redis(port=port, socket_connect_timeout=0.5, socket_timeout=0.5)

    def master_port(self) -> int | None:
        """The primary's port as the first sentinel that answers names it."""
        for port in self.sentinel_ports:
            client = self._sentinel(port)
            try:
                _, master = client.sentinel_get_master_addr_by_name(MASTER_NAME)
                return int(master)
            except Exception:  # that sentinel is away: ask the next
                continue
            finally:
                client.close()
        return None

    def kill_primary(self) -> None:
        """SIGKILL the primary (the replica's link drops; the sentinels fail over)."""
        self.primary.kill()

    def wait_failover(self, timeout: float = 30.0) -> int:
        """Until the sentinels name the replica as primary and it accepts writes; its port."""
        port = self.replica.port
        poll(lambda: self.master_port() == port, timeout, "the sentinels to promote the replica")
        client = self.replica.client()
        try:
            poll(
                lambda: client.info("replication")["role"] == "master",
                timeout,
                "the replica to take the primary's role",
            )
        finally:
            client.close()
        return port

    def stop(self) -> None:
        """Stop every process and remove the folder (when this set made it)."""
        for proc in self.sentinels:
            proc.terminate()
        for proc in self.sentinels:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.sentinels = []
        self.replica.stop()
        self.primary.stop()
        if self._tmp is not None:
            self._tmp.cleanup()

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
