"""A private `redis-server` (no persistence) for tests and benchmarks, and the default URL.

The executable is `redis-server` on PATH, else the one a pip package put into the environment
(`dagsched.daemon.redis_binary`).
"""

from __future__ import annotations

import subprocess
import time

from dagsched.daemon.broker import free_port
from dagsched.daemon.redis_binary import INSTALL_HINT, find_redis_server

DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


class RedisServer:
    """A private `redis-server` (no persistence) on a fixed port that may be stopped and
    restarted (tests use that to take Redis away from a daemon)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        binary = find_redis_server()
        if binary is None:
            raise RuntimeError(f"no redis-server found: run `make setup`, or {INSTALL_HINT}")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.02)  # polling a child process's port

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None
