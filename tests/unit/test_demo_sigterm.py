"""`dagsched demo` under SIGTERM: the run is cancelled and its cleanup runs, as after Ctrl-C
(before, the process died and left its embedded broker running)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from dagsched.cli.demo_cmds import run_until_sigterm


def test_sigterm_cancels_the_run_and_its_cleanup_runs():
    cleaned: list[bool] = []
    unhandled: list[int] = []
    # were the run's own handler missing, SIGTERM would land here instead of ending the worker
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: unhandled.append(signum))

    async def demo() -> None:
        asyncio.get_running_loop().call_soon(os.kill, os.getpid(), signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.Event().wait(), 10)  # until cancelled
        finally:
            cleaned.append(True)

    try:
        with pytest.raises(asyncio.CancelledError):
            run_until_sigterm(demo())
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert cleaned == [True]
    assert unhandled == []
