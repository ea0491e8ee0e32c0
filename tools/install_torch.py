"""Install torch for `make setup`: the CPU build unless asked otherwise, never a CUDA build by
accident. Run with .venv's Python: `install_torch.py SPEC [--index INDEX] [--dry-run]`.

INDEX is `cpu` (default), a build of the PyTorch wheel index (`cu126`, `cu128`, `rocm6.4`, ...),
or `pypi` (PyPI's own build, which is the CUDA one on Linux x86_64). The wheel index is tried
with a short socket timeout and no retries, so that where it is unreachable the attempt fails in
about a second; then SPEC comes from pip's default sources instead (on a machine with a local
CPU wheel, that one). A venv that already holds SPEC of the asked build is left alone; one that
holds another build of it gets the asked one.

Standard library only. `--dry-run` resolves and prints what pip would install, changing nothing.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from importlib import metadata

WHEEL_INDEX = "https://download.pytorch.org/whl/"
BUILD = re.compile(r"^(cpu|cu\d{3,}|rocm\d+(\.\d+)*|pypi)$")
INDEX_TIMEOUT_S = 10  # pip's socket timeout for the wheel index (it is a big download too)


def say(line: str) -> None:
    print(f"install_torch: {line}", flush=True)


def installed() -> str | None:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def wanted(version: str, build: str) -> str:
    """The version string of that build (`2.13.0+cpu`). PyPI's carries no build tag, and
    neither does any wheel outside Linux (there PyPI's build is the CPU one)."""
    return version if build == "pypi" or sys.platform != "linux" else f"{version}+{build}"


def pip(*args: str) -> int:
    return subprocess.run([sys.executable, "-m", "pip", *args]).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", help="a pinned requirement, e.g. torch==2.13.0")
    parser.add_argument("--index", default="cpu", help="cpu (default), cu126, ..., or pypi")
    parser.add_argument("--dry-run", action="store_true", help="resolve only; install nothing")
    args = parser.parse_args(argv)
    pinned = re.fullmatch(r"torch==(\d+(?:\.\d+)*)", args.spec)
    if pinned is None:
        parser.error(f"spec: expected torch==X.Y.Z, got {args.spec!r}")
    if not BUILD.match(args.index):
        parser.error(f"--index: expected cpu, cuNNN, rocmX.Y or pypi, got {args.index!r}")
    version = pinned.group(1)
    want = wanted(version, args.index)

    mode = ["--dry-run", "--ignore-installed"] if args.dry_run else []
    have = installed()
    if not args.dry_run and have is not None:
        if have == want:
            say(f"torch {have} already installed")
            return 0
        say(f"torch {have} installed, {want} asked: replacing it")
        if pip("uninstall", "-y", "torch") != 0:
            return 1

    if want != version:  # a tagged build: only the wheel index (or a local copy of it) has it
        url = WHEEL_INDEX + args.index
        started = time.monotonic()
        fast = ["--timeout", str(INDEX_TIMEOUT_S), "--retries", "0"]
        if pip("install", *mode, *fast, "--index-url", url, f"torch=={want}") == 0:
            return 0
        say(
            f"{url} did not serve torch=={want} ({time.monotonic() - started:.1f} s); "
            f"installing {args.spec} from pip's default index instead (on Linux x86_64, "
            "unless a local wheel is found, that is a CUDA build)"
        )
    if pip("install", *mode, args.spec) != 0:
        return 1
    got = installed()
    if not args.dry_run and got != want:
        say(f"asked for torch {want}, installed {got}: the only build reachable here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
