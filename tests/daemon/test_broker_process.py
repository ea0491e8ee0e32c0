"""The embedded broker does not outlive the process that started it, even one killed with
SIGKILL (no cleanup of its own runs): Linux sends the broker SIGTERM when its parent dies."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# a process that starts the broker as `dagsched demo` and `dagsched services` do (inside
# asyncio.run), says the broker's pid, and waits to be killed
STARTER = textwrap.dedent(
    """
    import asyncio, sys
    from dagsched.daemon.broker import embedded_broker
    from dagsched.settings import load_settings

    async def main():
        s = load_settings(None, {"topic_prefix": "pdeath."})
        async with embedded_broker(s) as broker:
            print(broker.proc.pid, flush=True)
            await asyncio.Event().wait()

    asyncio.run(main())
    """
)


def test_a_broker_whose_starter_is_killed_stops() -> None:
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert starter.stdout is not None
        line = starter.stdout.readline()  # the broker listens and has its topics
        assert line.strip().isdigit(), f"starter said {line!r}, exit code {starter.poll()}"
        pid = int(line)
        ended = os.pidfd_open(pid)  # readable once that process has exited
        try:
            assert not select.select([ended], [], [], 0)[0]  # it runs while its starter does
            starter.send_signal(signal.SIGKILL)
            starter.wait(10)
            readable, _, _ = select.select([ended], [], [], 10.0)
            if not readable:
                os.kill(pid, signal.SIGKILL)  # leave no broker behind the failure
            assert readable, f"the broker (pid {pid}) outlived the process that started it"
        finally:
            os.close(ended)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
