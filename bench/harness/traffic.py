"""Back-to-back closed-loop replays as load for a bench, in a process of their own.

`Traffic` starts this file as that process (`python bench/harness/traffic.py ...`): it replays
until SIGTERM, finishes the replay in flight, and prints one JSON list of results on stdout.
It imports nothing from the rest of the harness, so it runs with only dagsched on the path.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dagsched.settings import Settings, load_settings

REPO = Path(__file__).resolve().parents[2]  # the repository root: bench/harness/..


async def traffic(
    settings: Settings, workflows: int, until: asyncio.Event, out: list[dict[str, Any]]
) -> None:
    """Back-to-back replays until `until` is set (the running one always finishes)."""
    from dagsched.daemon.replay import ReplayConfig, ReplayError, replay

    seed = 0
    while True:
        t = time.time()
        try:
            r = await replay(settings, ReplayConfig(workflows=workflows, seed=seed))
        except ReplayError as exc:
            out.append({"seed": seed, "started": t, "error": str(exc)})
            return
        keep = (
            "workflows_failed",
            "tasks_sent",
            "decisions_received",
            "duplicates",
            "rejected",
            "dead_letters",
            "wall_s",
        )
        out.append(
            {
                "seed": seed,
                "started": t,
                "ended": time.time(),
                "workflows_ended": r.get("workflows"),
                **{k: r.get(k) for k in keep},
            }
        )
        seed += 1
        if until.is_set():
            return


def traffic_worker(args: argparse.Namespace) -> None:
    """Replay against the stack the arguments name until SIGTERM, then print one JSON list of
    results on stdout."""
    s = load_settings(
        None,
        {"kafka_bootstrap": args.bootstrap, "redis_url": args.redis_url,
         "topic_prefix": args.prefix, "home": args.home, "log_level": "WARNING"},
        environ={},
    )  # fmt: skip

    async def main() -> list[dict[str, Any]]:
        until = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, until.set)
        out: list[dict[str, Any]] = []
        await traffic(s, args.workflows, until, out)
        return out

    print(json.dumps(asyncio.run(main())))


class Traffic:
    """The replays in their own process, so they do not share a GIL with the bench."""

    def __init__(self, settings: Settings, workflows: int) -> None:
        self.s = settings
        self.workflows = workflows
        self.proc: asyncio.subprocess.Process | None = None
        self.results: list[dict[str, Any]] = []

    async def start(self) -> None:
        """Start the worker process (its stderr goes to `home/traffic.log`)."""
        s = self.s
        log = (s.home / "traffic.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--bootstrap", s.kafka_bootstrap,
            "--redis-url", s.redis_url, "--prefix", s.topic_prefix, "--home", str(s.home),
            "--workflows", str(self.workflows),
            cwd=str(REPO), stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=log, env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        )  # fmt: skip
        log.close()

    @property
    def running(self) -> bool:
        """Whether the worker process is still running."""
        return self.proc is not None and self.proc.returncode is None

    async def finish(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        """Let the replay in flight finish, then collect every result."""
        if self.proc is None:
            return []
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            return [{"error": f"the traffic process did not finish within {timeout:g} s"}]
        try:
            self.results = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.results = [{"error": f"the traffic process exited {self.proc.returncode}"}]
        return self.results


def main() -> None:
    """The `Traffic` worker process: replays against the given stack until SIGTERM."""
    ap = argparse.ArgumentParser(description="bench traffic worker (started by Traffic)")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--redis-url", required=True)
    ap.add_argument("--prefix", required=True)
    ap.add_argument("--home", required=True)
    ap.add_argument("--workflows", type=int, required=True)
    args = ap.parse_args()
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)  # stderr: stdout is the JSON result
    traffic_worker(args)


if __name__ == "__main__":
    main()
