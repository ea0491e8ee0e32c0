"""Chaos: faults under a steady load, with counts of what each one cost.

Setup, all on this machine (`harness/chaos_services.py`): the embedded Tansu broker, a
`redis-server` with an AOF (fsync every second), MLflow (an `mlflow server` when the `mlflow`
fault runs, else SQLite), two `dagsched daemon` replicas serving the shipped champion, a
`dagsched learner` and a `dagsched evaluator`, each a process as users run them. A producer
offers `--rate` tasks/s (the default scenario's workflows, each followed by its tasks) and the
cluster's heartbeats every second; a reader keeps every decision and dead letter per task
(`harness/chaos_load.py`).

Faults, in turn, each after `pre` seconds of steady load and followed by `post` seconds:
- `redis_kill`: SIGKILL Redis, restart it empty 10 s later;
- `redis_stop`: stop Redis (SIGTERM, the AOF is flushed) for 30 s, restart it with its data;
- `mlflow`: stop the MLflow server for 60 s; a promotion (`dagsched models promote`) is tried
  during the outage and again after it;
- `replica_kill`: SIGKILL daemon replica 0 under load (a batch is in flight at 200 tasks/s);
  a supervisor's restart 5 s later;
- `replica_pause`: SIGSTOP replica 1 for the consumer session timeout (10 s) + 5 s, SIGCONT;
- `broker`, last: stop the broker, restart it 10 s later (Tansu keeps its log in memory: it
  comes back empty, topics are created again).

Per fault: tasks sent, decided, lost (no decision, no dead letter; for `broker`, tasks the
broker had acknowledged and lost with its log are counted apart), decided twice differently,
dead-lettered; the time from recovery to the first decision of a task sent after it; p99
latency (sent to first decision) before, during and after; and `settle_s`, the time after
recovery until p99 stays under the steady state's (2 x the warm-up p99, at least +100 ms)
in 2-second windows. `--quick` scales outages by 0.1 (the pause stays over the session
timeout), and steady phases to a few seconds.

    PYTHONPATH=. .venv/bin/python bench/chaos.py [--quick] [--json] [--faults a,b] [--rate 200]

Prints a table (stderr with `--json`), writes bench/results/chaos.json (`--quick`:
chaos_quick.json); `--json` prints the document on stdout. Exit code 1 when a target is missed:
a lost or conflicting decision where the broker keeps its log, or a service not running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
from harness.chaos_load import Answers, Key, Load
from harness.chaos_services import Stack, build
from harness.results import write_results
from harness.stack import REPO
from rich.console import Console
from rich.table import Table

# the broker last: Tansu comes back empty, and what follows from that (offsets committed
# before the restart, past the new log's end) would be charged to the faults after it
FAULTS = ("redis_kill", "redis_stop", "mlflow", "replica_kill", "replica_pause", "broker")
SESSION_TIMEOUT_S = 10.0  # aiokafka's default session timeout (the daemon's consumer)


class Run:
    """One chaos run: the stack, the load, and what each fault recorded."""

    def __init__(self, args: argparse.Namespace, stack: Stack, console: Console) -> None:
        self.args = args
        self.stack = stack
        self.console = console
        self.load: Load | None = None
        self.answers: Answers | None = None
        self.marks: dict[str, dict[str, Any]] = {}
        self.rejoined: asyncio.Event | None = None  # the killed replica's restart started

    def scaled(self, seconds: float) -> float:
        return seconds * self.args.scale

    async def wait(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # the fault's duration: wall time is what it is about

    async def until(self, cond: Callable[[], Any], timeout: float, what: str) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = cond()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return True
            await asyncio.sleep(0.2)
        self.console.log(f"[yellow]timed out waiting for {what}")
        return False

    # -- faults: each returns (fault at, recovered at, notes) ----------------------------------

    async def redis_kill(self) -> tuple[float, float, dict[str, Any]]:
        r = self.stack.redis
        at = time.time()
        await asyncio.to_thread(r.kill)
        await self.wait(self.scaled(10))
        await asyncio.to_thread(r.wipe)
        await asyncio.to_thread(r.start)
        return at, time.time(), {"restarted": "empty"}

    async def redis_stop(self) -> tuple[float, float, dict[str, Any]]:
        r = self.stack.redis
        before = await asyncio.to_thread(_dbsize, r)
        at = time.time()
        await asyncio.to_thread(r.stop)
        await self.wait(self.scaled(30))
        await asyncio.to_thread(r.start)
        after = await asyncio.to_thread(_dbsize, r)
        return at, time.time(), {"keys_before": before, "keys_after_restart": after}

    async def broker(self) -> tuple[float, float, dict[str, Any]]:
        at = time.time()
        await asyncio.to_thread(self.stack.broker.stop)
        await self.wait(self.scaled(10))
        await self.stack.restart_broker()
        assert self.answers is not None
        self.answers.reassign()
        return at, time.time(), {"restarted": "empty (Tansu keeps its log in memory)"}

    async def mlflow(self) -> tuple[float, float, dict[str, Any]]:
        ml = self.stack.mlflow
        assert ml is not None
        at = time.time()
        await asyncio.to_thread(ml.stop)
        during = await self.promote("2")
        await self.wait(max(0.0, self.scaled(60) - (time.time() - at)))
        await asyncio.to_thread(ml.start)
        back = time.time()
        after = await self.promote("2")
        served = await self.until(
            lambda: all(
                (h := self.stack.health(i)) is not None
                and str(h["models"]["champion"]).lstrip("v") == "2"
                for i in range(len(self.stack.daemons))
            ),
            60,
            "every replica to serve version 2",
        )
        notes = {
            "promote_during": during,
            "promote_after": after,
            "replicas_serve_new_champion_s": round(time.time() - back, 2) if served else None,
        }
        return at, back, notes

    async def promote(self, version: str) -> dict[str, Any]:
        """`dagsched models promote VERSION` as an operator runs it: exit code, last line."""
        env = {**self.stack.env(20), "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",
               "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}  # fmt: skip
        t = time.monotonic()
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "dagsched.cli.main", "models", "promote", version,
             "--reason", "chaos"],
            cwd=str(REPO), env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
        return {
            "exit": done.returncode,
            "seconds": round(time.monotonic() - t, 1),
            "said": lines[-1][:200] if lines else "",
        }

    async def replica_kill(self) -> tuple[float, float, dict[str, Any]]:
        r = self.stack.daemons[0]
        at = time.time()
        r.proc.kill()
        await r.proc.wait()
        await self.wait(self.scaled(5) if self.args.quick else 5)
        back = time.time()
        r = await self.stack.start_daemon(0)  # the supervisor's restart; it rejoins meanwhile
        self.rejoined = r.started
        return at, back, {"restarted_after_s": round(back - at, 1)}

    async def replica_pause(self) -> tuple[float, float, dict[str, Any]]:
        r = self.stack.daemons[1]
        at = time.time()
        r.proc.send_signal(signal.SIGSTOP)
        await self.wait(SESSION_TIMEOUT_S + 5)
        r.proc.send_signal(signal.SIGCONT)
        return at, time.time(), {"paused_s": SESSION_TIMEOUT_S + 5}

    # -- the run ------------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        a, st = self.args, self.stack
        for i in range(2):
            await st.start_daemon(i)
        await st.start_service("learner")
        await st.start_service("evaluator")
        # started: the model is loaded (or the fallback serves) and the loop consumes
        ok = await self.until(lambda: all(r.started.is_set() for r in st.daemons), 300,
                              "both replicas")  # fmt: skip
        if not ok:
            raise RuntimeError(f"the replicas did not start: see {st.home}/daemon-*.log")
        every = frozenset(range(st.settings.topics.partitions))
        await self.until(
            lambda: (
                st.daemons[0].partitions | st.daemons[1].partitions == every
                and all(r.partitions for r in st.daemons)
            ),
            60,
            "the partitions to be shared",
        )
        self.answers = Answers(st.settings)
        self.load = Load(st.settings, a.rate).start()
        self.console.log(f"steady load: {a.rate:g} tasks/s")
        await self.wait(a.warmup)
        faults: dict[str, Callable[[], Awaitable[tuple[float, float, dict[str, Any]]]]] = {
            name: getattr(self, name) for name in FAULTS
        }
        for name in a.faults:
            self.load.phase = name
            start = time.time()
            await self.wait(a.pre)
            self.console.log(f"fault: {name}")
            try:
                at, back, notes = await faults[name]()
            except Exception as exc:  # the harness failed to inject or undo it: say so, go on
                self.console.log(f"[red]{name}: {exc}")
                at, back, notes = start + a.pre, time.time(), {"error": str(exc)}
            self.console.log(f"recovered from {name} after {back - at:.1f} s")
            await self.wait(a.post)
            self.marks[name] = {
                "start": start, "fault_at": at, "recovered_at": back, "end": time.time(),
                "alive": st.alive(), **notes,
            }  # fmt: skip
        self.load.phase = "cooldown"
        self.load.stop()
        await self.until(self._drained, a.drain, "every acknowledged task to be answered")
        if self.rejoined is not None:
            ok = await self.until(self.rejoined.is_set, 300, "the restarted replica")
            self.marks["replica_kill"]["answers_again"] = ok
        alive = st.alive()
        health = {f"daemon-{i}": (st.health(i) or {}).get("status") for i in range(2)}
        self.answers.close()
        return self.report(alive, health)

    def _drained(self) -> bool:
        assert self.load is not None and self.answers is not None
        ans = self.answers
        return all(
            k in ans.decisions or k in ans.dead
            for k, ok in self.load.sent.acked.items()
            if ok and self.load.sent.phase[k] != "broker"
        )

    # -- counting -----------------------------------------------------------------------------

    def report(self, alive: dict[str, bool], health: dict[str, Any]) -> dict[str, Any]:
        assert self.load is not None and self.answers is not None
        sent, ans = self.load.sent, self.answers
        first = {k: v[0][0] for k, v in ans.decisions.items()}

        def latencies(keys: list[Key]) -> np.ndarray:
            return np.array([first[k] - sent.at[k] if k in first else np.inf for k in keys])

        def p99(keys: list[Key]) -> float | None:
            if not keys:
                return None
            v = float(np.percentile(latencies(keys), 99))
            return round(v * 1000, 1) if np.isfinite(v) else None

        # steady state: the first fault's phase before its fault (the warm-up holds the
        # replicas' joins and rebalances)
        m0 = next(iter(self.marks.values()))
        calm = [k for k, ph in sent.phase.items() if m0["start"] <= sent.at[k] < m0["fault_at"]]
        steady = p99(calm) or 0.0
        threshold_ms = max(2 * steady, steady + 100.0)
        rows: dict[str, Any] = {}
        for name, m in self.marks.items():
            keys = [k for k, ph in sent.phase.items() if ph == name]
            at, back = m["fault_at"], m["recovered_at"]
            answers = {k: {raw for _, raw in ans.decisions.get(k, [])} for k in keys}
            refused = [k for k in keys if sent.acked.get(k) is False]
            unacked = [k for k in keys if sent.acked.get(k) is None]
            decided = [k for k in keys if answers[k]]
            dead = [k for k in keys if not answers[k] and k in ans.dead]
            # lost: the broker acknowledged it, and nothing answered it
            missing = [k for k in keys if not answers[k] and k not in ans.dead
                       and sent.acked.get(k) is True]  # fmt: skip
            in_log = []
            if name == "broker":  # acknowledged by the broker, then gone with its memory
                in_log = [k for k in missing if sent.acked_at.get(k, at) < at]
                missing = [k for k in missing if k not in set(in_log)]
            conflicting = [k for k in keys if len(answers[k]) > 1]
            after = [k for k in keys if sent.at[k] >= back]
            firsts = [first[k] - back for k in after if k in first]
            rows[name] = {
                "sent": len(keys),
                "decided": len(decided),
                "lost": len(missing),
                "lost_with_broker_log": len(in_log),
                "refused_by_broker": len(refused),
                "never_acknowledged": len(unacked),
                "conflicting": len(conflicting),
                "dead_lettered": len(dead),
                "duplicates": sum(max(0, len(ans.decisions.get(k, [])) - 1) for k in keys),
                "outage_s": round(back - at, 1),
                "first_decision_s": round(min(firsts), 3) if firsts else None,
                "p99_before_ms": p99([k for k in keys if sent.at[k] < at]),
                "p99_during_ms": p99([k for k in keys if at <= sent.at[k] < back]),
                "p99_after_ms": p99(after),
                "settle_s": _settle(after, latencies(after), sent.at, back, threshold_ms / 1000),
                "dead_reasons": sorted({r for k in dead for r in ans.dead[k]})[:5],
                "notes": {k: v for k, v in m.items() if k not in ("start", "end")},
            }
        keeps_log = [n for n in rows if n != "broker"]
        targets = {
            "no_loss_where_the_log_is_kept": all(rows[n]["lost"] == 0 for n in keeps_log),
            "no_conflicts": all(r["conflicting"] == 0 for r in rows.values()),
            "every_service_running": all(alive.values()),
            "p99_settles_within_30s": all(
                r["settle_s"] is not None and r["settle_s"] <= 30 for r in rows.values()
            ),
        }
        return {
            "faults": rows,
            "steady_p99_ms": steady,
            "settle_threshold_ms": round(threshold_ms, 1),
            "alive_at_end": alive,
            "health_at_end": health,
            "restarts": self.stack.restarts,
            "producer_errors": self.load.errors,
            "targets": targets,
        }


def _settle(
    keys: list[Key], lat: np.ndarray, sent: dict[Key, float], back: float, limit: float
) -> float | None:
    """Seconds after `back` until every 2-second window of sends has p99 under `limit`
    (None: never in the time observed)."""
    if not keys:
        return None
    t = np.array([sent[k] - back for k in keys])
    last_bad = 0.0
    for lo in np.arange(0.0, float(t.max()) + 2.0, 2.0):
        window = lat[(t >= lo) & (t < lo + 2.0)]
        if window.size and not np.percentile(window, 99) <= limit:  # an undecided task: inf
            last_bad = float(lo + 2.0)
    return None if last_bad >= float(t.max()) else round(last_bad, 1)


def _dbsize(r: Any) -> int:
    client = r.client(timeout=2)
    try:
        return int(client.dbsize())
    finally:
        client.close()


def show(doc: dict[str, Any], console: Console) -> None:
    """The table: one row per fault."""
    t = Table(title=f"chaos at {doc['setup']['rate']:g} tasks/s (steady p99 "
              f"{doc['steady_p99_ms']:.0f} ms)")  # fmt: skip
    cols = ("fault", "outage s", "sent", "not acked", "decided", "lost", "conflicting",
            "dead-lettered", "first decision s", "p99 during ms", "p99 after ms",
            "settle s")  # fmt: skip
    for c in cols:
        t.add_column(c, justify="left" if c == "fault" else "right")

    def f(v: Any) -> str:
        return "-" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:,.1f}"

    for name, r in doc["faults"].items():
        lost = f(r["lost"])
        if r["lost_with_broker_log"]:
            lost += f" (+{r['lost_with_broker_log']:,} in the broker's log)"
        t.add_row(
            name, f(r["outage_s"]), f(r["sent"]), f(r["never_acknowledged"]), f(r["decided"]),
            lost, f(r["conflicting"]),
            f(r["dead_lettered"]), f(r["first_decision_s"]), f(r["p99_during_ms"]),
            f(r["p99_after_ms"]), f(r["settle_s"]),
        )  # fmt: skip
    console.print(t)
    down = [k for k, v in doc["alive_at_end"].items() if not v]
    console.print(f"services running at the end: {'all' if not down else 'not ' + ', '.join(down)}")
    console.print(f"targets: {doc['targets']}")


async def main_async(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    home = args.home or Path(tempfile.mkdtemp(prefix="dagsched-chaos-"))
    t0 = time.monotonic()
    stack = await build(home, with_mlflow="mlflow" in args.faults, registry=not args.no_registry,
                        say=console.log)  # fmt: skip
    try:
        doc = await Run(args, stack, console).run()
    finally:
        await stack.close()
        if args.keep_home or args.home:
            console.log(f"kept {home}")
        else:
            shutil.rmtree(home, ignore_errors=True)
    doc["setup"] = {
        "quick": args.quick, "rate": args.rate, "faults": args.faults, "scale": args.scale,
        "pre_s": args.pre, "post_s": args.post, "warmup_s": args.warmup,
        "registry": not args.no_registry, "cpus": os.cpu_count(),
        "load_avg_end": os.getloadavg(), "wall_s": round(time.monotonic() - t0, 1),
    }  # fmt: skip
    return doc


def main() -> None:
    """Parse the options, run, print the table, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="outages x0.1, short steady phases")
    ap.add_argument("--json", action="store_true", help="the document on stdout")
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--rate", type=float, default=None, help="tasks/s (default 200; quick 100)")
    ap.add_argument("--no-registry", action="store_true", help="replicas serve the heuristic")
    ap.add_argument("--keep-home", action="store_true")
    ap.add_argument("--home", type=Path, default=None, help="use (and keep) this folder")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(args.faults) - set(FAULTS))
    if unknown:
        print(f"error: unknown fault {unknown[0]!r} (faults: {', '.join(FAULTS)})", file=sys.stderr)
        sys.exit(2)
    if args.quick:
        args.scale, args.warmup, args.pre, args.post, args.drain = 0.1, 3.0, 2.0, 5.0, 30.0
        args.rate = args.rate or 100.0
    else:
        args.scale, args.warmup, args.pre, args.post, args.drain = 1.0, 15.0, 10.0, 30.0, 120.0
        args.rate = args.rate or 200.0
    name = "chaos_quick.json" if args.quick else "chaos.json"
    out = args.out or REPO / "bench" / "results" / name
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    console = Console(stderr=True, width=140)
    doc = asyncio.run(main_async(args, console))
    show(doc, console if args.json else Console(width=140))
    written = write_results(out, doc, default=float)
    console.log(f"wrote {out}")
    if args.json:
        print(json.dumps(written, default=float))
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    sys.exit(0 if all(doc["targets"].values()) else 1)


if __name__ == "__main__":
    main()
