"""Soak: one daemon and one updater under a steady 1,000 tasks/s for 30 minutes; does it stay flat?

Setup, all on this machine: the embedded Tansu broker, a private `redis-server`, an MLflow
SQLite registry in a temporary home holding the shipped champion (`models/champion`), and the
default 32-node cluster written into Redis as heartbeats. Two processes started the way a
user starts them: `python -m dagsched.cli.main daemon --no-updater` (serving the champion;
it waits for the model's load before its first batch) and `python -m dagsched.cli.main
updater`, code defaults and configs/default.yaml, JSON logs on stderr.

Load (`harness/soak_load.py`): a job queue and a cluster in one thread of this process.
Workflows of the default scenario arrive as needed to offer `--rate` `task_ready` per second
(each with `at`, so batches wait for the updater as deployed); a task is ready once its
parents have finished; each decision read back is reported started (and a node heartbeat), and
about a second later finished or failed (4%; a failed attempt is asked again as the next
attempt, up to the decision's `max_retries`). Three events per decision. Its producer lingers
`--linger-ms` (50): the embedded broker's CPU per request grows with the batches it holds
(docs/operations/soak.md); `--bootstrap HOST:PORT` runs against a Kafka instead.

Measured, t = 0 when the load starts (after the daemon serves the champion and the updater
applied a first event):
- every 10 s: the daemon's and the updater's RSS and CPU seconds (/proc; CPU also of the
  embedded broker, redis-server and this process), Redis `used_memory` and its keys;
- every 0.5 s: the updater's lag (per partition of `dagsched.events`, the newest event
  acknowledged minus the newest its group has committed, in job-queue seconds; the worst
  partition) and the events acknowledged and not yet committed;
- per period (a minute; 30 s with `--quick`), by send time: tasks offered and decided,
  submit-to-decision latency p50 / p99 / max (this process's clock: handed to the producer to
  read back from `dagsched.decisions`), the updater's lag, RSS and Redis;
- after the load: the tasks still undecided after a drain (lost), the attempts' ends applied,
  the reservation ledgers (`led:`) left, Redis by key family (MEMORY USAGE) and so its bytes
  per (decision/s) of sustained rate at the run's `decision_ttl_s` and `workflow_ttl_s`.

Targets (warm-up: the first third of the run):
- daemon RSS: at most 5% growth over the last two-thirds (first sample after the warm-up to
  the last sample of the load);
- latency: p99 of the last window at most 10% above the first window after the warm-up (the
  time after the warm-up is cut into four windows);
- Redis: bytes per (decision/s) at most what docs/operations/event-side.md states (504 B
  per decision for `decision_ttl_s` + 326 B for `workflow_ttl_s`: 8.55 MiB at the defaults);
  the decision log within `decision_log_max_mb`;
- 0 ledgers left, 0 lost, 0 dead letters; the updater's lag p99 after the warm-up <= 1 s;
- the last window decided at least 98% of the rate offered (a daemon that falls behind is
  not in a steady state, whatever else holds).

    PYTHONPATH=. .venv/bin/python bench/soak.py [--minutes 30] [--rate 1000] [--quick] [--json]
        [--linger-ms 50] [--bootstrap HOST:PORT] [--out PATH]

Prints a line per period on stderr while it runs, then the tables (stderr with `--json`);
writes `bench/results/soak.json` and `soak.png` (RSS, Redis, CPU and latency over time);
`--quick` (2 minutes of load, ~3 minutes in all): `soak_quick.json` and `soak_quick.png`;
`--json` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness.event_side import (
    WORKFLOW_KEYS,
    Committed,
    _bytes_per_rate,
    _updater_ready,
    start_updater,
)
from harness.in_process import prepare
from harness.replicas import Replica, start_replica, stop_replica, wait_until
from harness.results import write_results
from harness.soak_load import SLOT_S, SoakLoad
from harness.stack import REPO, git_state, local_stack
from harness.throughput_report import cpu_seconds, redis_bytes, stopped_stats
from rich.console import Console
from rich.table import Table

from dagsched.settings import Settings

SAMPLE_S = 10.0  # RSS, CPU and Redis
# the load's producer batches this long: the embedded broker's (Tansu 0.6, memory storage) CPU
# per request grows with the batches it holds, and 5 ms (1,000 one-record batches a second
# here) saturated a core within a minute; 50 ms adds ~25 ms to the mean latency
LINGER_MS = 50.0
LAG_S = 0.5  # the updater's lag
MiB = 2**20
# docs/operations/event-side.md: what Redis keeps per decision, and for how long
DOC_DECISION_B, DOC_WORKFLOW_B = 504, 326  # the largest stored decision measured
TARGETS = {
    "rss_growth": 0.05,  # daemon RSS, last two-thirds
    "p99_last_vs_first": 1.10,  # last window's p99 / first window's after the warm-up
    "redis_bytes_per_decision_per_s": None,  # set from the settings (docs' formula)
    "decision_log_vs_cap": 1.0,
    "ledgers_left": 0,
    "lost": 0,
    "dead_letters": 0,
    "lag_p99_s": 1.0,  # the updater, after the warm-up
    "decided_vs_offered": 0.98,  # the last window: decided per second / offered (at least)
}
AT_LEAST = ("decided_vs_offered",)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of process `pid` (Linux /proc; None once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def children(names: tuple[str, ...]) -> dict[str, int]:
    """Child processes of this one whose command name starts with one of `names` (the broker
    and the private redis-server), by that name (Linux /proc)."""
    me, found = os.getpid(), {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm, ppid = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :]
        if int(ppid.split()[1]) == me:
            for n in names:
                if comm.startswith(n):
                    found[n] = int(d.name)
    return found


def pct(x: np.ndarray, q: float) -> float | None:
    return float(np.percentile(x, q)) if x.size else None


def ms(x: float | None) -> float | None:
    return None if x is None else x * 1000


class Soak:
    """One run: the processes, the load, the samples."""

    def __init__(self, args: argparse.Namespace, console: Console) -> None:
        self.args = args
        self.console = console
        self.samples: list[dict[str, Any]] = []
        self.lags: list[tuple[float, float, int]] = []  # (t, seconds, records)
        self.procs: dict[str, Replica] = {}
        self.others: dict[str, int] = {}  # the embedded broker, redis-server, this process

    async def sample(self, rds: Any, load: SoakLoad) -> dict[str, Any]:
        info = await rds.info("memory")
        keys = await rds.dbsize()
        row: dict[str, Any] = {"t": round(load.now(), 1)}
        for name, r in self.procs.items():
            row[f"{name}_rss"] = rss_bytes(r.proc.pid)
            row[f"{name}_cpu_s"] = cpu_seconds(r.proc.pid)
        for name, pid in self.others.items():
            row[f"{name}_cpu_s"] = cpu_seconds(pid)
            if name != "redis":  # its used_memory and RSS come from INFO
                row[f"{name}_rss"] = rss_bytes(pid)
        row.update({
            "redis_used_memory": info["used_memory"], "redis_rss": info["used_memory_rss"],
            "redis_keys": keys, "offered": load.counts.offered, "decided": load.counts.decided,
            "pending": len(load.pending), "running": load.running(),
            "lag_s": self.lags[-1][1] if self.lags else None,
        })  # fmt: skip
        self.samples.append(row)
        return row

    def period(self, load: SoakLoad, t0: float, t1: float) -> dict[str, Any]:
        """What the tasks sent in [t0, t1) saw (latency), the decisions read back and the
        samples taken meanwhile."""
        lat = load.latencies(t0, t1)
        lags = np.array([x for t, x, _ in self.lags if t0 <= t < t1])
        inside = [s for s in self.samples if t0 <= s["t"] <= t1] or self.samples[-1:]
        last = inside[-1] if inside else {}
        return {
            "cpu_cores": cpu_cores(inside),
            "from_s": t0, "to_s": t1, "sent_decided": int(lat.size),
            # read back in the period, whenever sent: what keeping up is read from
            "decided_per_s": load.decided_in(t0, t1) / (t1 - t0),
            "p50_ms": ms(pct(lat, 50)), "p99_ms": ms(pct(lat, 99)),
            "max_ms": ms(float(lat.max())) if lat.size else None,
            "lag_p99_s": pct(lags, 99), "lag_max_s": float(lags.max()) if lags.size else None,
            "daemon_rss": last.get("daemon_rss"), "updater_rss": last.get("updater_rss"),
            "redis_used_memory": last.get("redis_used_memory"),
        }  # fmt: skip

    def say_period(self, p: dict[str, Any], load: SoakLoad) -> None:
        c = load.counts
        f = _fmt
        self.console.log(
            f"{p['from_s'] / 60:4.1f}-{p['to_s'] / 60:4.1f} min: {p['decided_per_s']:,.0f} "
            f"decided/s (offered {c.offered:,}, pending {len(load.pending):,}), p50 "
            f"{f(p['p50_ms'])} ms, p99 {f(p['p99_ms'])} ms; daemon RSS "
            f"{f(_mib(p['daemon_rss']))} MiB, updater {f(_mib(p['updater_rss']))} MiB; Redis "
            f"{f(_mib(p['redis_used_memory']))} MiB; lag max {f(p['lag_max_s'], 2)} s; CPU "
            + ", ".join(f"{k} {v:.2f}" for k, v in p["cpu_cores"].items())
        )

    async def run(self, stack_settings: Settings) -> dict[str, Any]:
        from dagsched.daemon.redis_state import RedisState
        from dagsched.daemon.updater import UPDATER_GROUP_SUFFIX
        from dagsched.registry.store import Registry

        a, s = self.args, stack_settings
        rds = await prepare(s)
        rs = RedisState(rds, s)
        version = await asyncio.to_thread(Registry(s).ensure_champion)
        if version is None:
            raise RuntimeError("the shipped champion did not register")
        self.console.log(f"registry: champion v{version} (the shipped bundle)")
        mem0 = (await rds.info("memory"))["used_memory"]
        doc: dict[str, Any] = {"champion": f"v{version}"}
        load: SoakLoad | None = None
        try:
            t_spawn = time.monotonic()
            self.procs["daemon"] = await start_replica(
                0, s, s.home, None, ("--no-updater",), env={"DAGSCHED_DAEMON__GRACE_S": "120"}
            )
            self.procs["updater"] = await start_updater(s)
            d = self.procs["daemon"]
            await wait_until(lambda: bool(d.swaps and d.assignments), 240,
                             "the daemon to serve the champion", [d])  # fmt: skip
            doc["updater_ready_s"] = await _updater_ready(s, rds, rs)
            doc["start_s"] = time.monotonic() - t_spawn
            self.console.log(f"daemon serving {d.serving} and updater applying events "
                             f"{doc['start_s']:.1f} s after they were started")  # fmt: skip
            group = s.topic_prefix + s.daemon.group_id + UPDATER_GROUP_SUFFIX
            found = children(("tansu", "redis-server"))
            names = {"tansu": "broker", "redis-server": "redis"}
            self.others = {**{names[k]: pid for k, pid in found.items()}, "bench": os.getpid()}
            load = SoakLoad(s, a.rate, a.linger_ms).start()
            async with Committed(s, group) as committed:
                doc["offered_per_s"] = await self.steady(rds, load, committed)
                doc["drain"] = await self.drain(load, committed)
            self.console.log(
                f"load over: {load.counts.offered:,} offered, {load.counts.decided:,} decided; "
                f"drained in {doc['drain']['drain_s']:.1f} s"
            )
            doc["ledgers_left"] = len([k async for k in rds.scan_iter(match=rs.key("led", "*"))])
            doc["redis"] = await redis_bytes(rds, s, load.counts.decided, mem0)
            doc["redis"]["bytes_per_decision_per_s"] = await held_per_rate(
                rds, rs, s, doc["redis"], list(load.done)
            )
            doc["redis"]["used_memory_start"] = mem0
        finally:
            if load is not None:
                load.close()
            doc["stopped"] = {}
            for name, r in self.procs.items():
                code = await stop_replica(r)
                doc["stopped"][name] = {"exit": code, **stopped_stats(r.log_path),
                                        "problems": r.problems[:20]}  # fmt: skip
            await rds.aclose()
        doc["counts"] = {**{k: v for k, v in vars(load.counts).items() if k != "arms"},
                         "arms": dict(load.counts.arms), "lost": len(load.pending)}  # fmt: skip
        doc["samples"] = self.samples
        every = int(2 / LAG_S)  # one lag sample in four: every 2 s
        doc["lag_series"] = [(round(t, 1), round(x, 3), n) for t, x, n in self.lags[::every]]
        doc["periods"] = [self.period(load, t, min(t + a.period_s, a.seconds))
                          for t in _starts(0.0, a.seconds, a.period_s)]  # fmt: skip
        doc["windows"] = [self.period(load, t, t + a.window_s)
                          for t in _starts(a.warmup_s, a.seconds, a.window_s)]  # fmt: skip
        lags = np.array([x for t, x, _ in self.lags if a.warmup_s <= t < a.seconds])
        doc["lag"] = {
            "p50_s": pct(lags, 50), "p99_s": pct(lags, 99),
            "max_s": float(lags.max()) if lags.size else None, "samples": int(lags.size),
        }  # fmt: skip
        return doc

    async def steady(self, rds: Any, load: SoakLoad, committed: Any) -> float:
        """The load for `seconds`: samples, lag, a line per period; the rate offered."""
        a = self.args
        next_sample, next_lag, next_period = 0.0, 0.0, a.period_s
        while (now := load.now()) < a.seconds:
            if now >= next_lag:
                lag, records = load.delivered.behind(await committed.offsets())
                self.lags.append((now, lag, records))
                next_lag += LAG_S
            if now >= next_sample:
                await self.sample(rds, load)
                next_sample += SAMPLE_S
            if now >= next_period:
                self.say_period(self.period(load, next_period - a.period_s, next_period), load)
                next_period += a.period_s
            for name, r in self.procs.items():
                if r.proc.returncode is not None:
                    raise RuntimeError(f"the {name} exited ({r.proc.returncode}): {r.log_path}")
            if not load.alive():
                raise RuntimeError("the load's thread stopped (its traceback is above)")
            await asyncio.sleep(0.05)
        offered = load.counts.offered / load.now()
        load.stop_offering()
        await self.sample(rds, load)  # the load's last sample
        self.say_period(self.period(load, next_period - a.period_s, a.seconds), load)
        return offered

    async def drain(self, load: SoakLoad, committed: Any) -> dict[str, Any]:
        """Until every task asked is decided and every attempt ended (at most `drain_s`), then
        until the updater has committed every event acknowledged (at most `drain_s` more)."""
        t0 = time.monotonic()
        while not load.drained() and time.monotonic() - t0 < self.args.drain_s:
            await asyncio.sleep(0.1)
        drained = load.drained()
        t1 = time.monotonic()
        records = -1
        while time.monotonic() - t1 < self.args.drain_s:
            _, records = load.delivered.behind(await committed.offsets())
            if records == 0 and len(load.p) == 0:  # every event acknowledged and applied
                break
            await asyncio.sleep(0.2)
        return {"drained": drained, "drain_s": t1 - t0, "events_left": records,
                "applied_s": time.monotonic() - t1}  # fmt: skip


async def held_per_rate(
    rds: Any, rs: Any, s: Settings, red: dict[str, Any], done: list[tuple[str, int]]
) -> dict[str, float]:
    """Redis bytes per (decision/s) of sustained rate: what one decision keeps, times how long.

    A stored decision (`dec:`) is one key per decision: its bytes / its keys. A workflow's keys
    (`wf:`, `wfdone:`, `wfnode:`, `wfactive:`) are per workflow and reach their full size
    when it ends: their bytes for the latest workflows done / the attempts those asked. (All
    workflow keys / all decisions, the throughput bench's figure, counts the DAGs of
    workflows still in flight against the decisions made so far, too much in a short run.)"""
    dec = red["families"].get("dec", {"keys": 0, "bytes": 0})
    dec_b = dec["bytes"] / max(1, dec["keys"])
    pipe = rds.pipeline(transaction=False)
    for wf_id, _ in done:
        for fam in WORKFLOW_KEYS:
            pipe.memory_usage(rs.key(fam, wf_id), samples=0)
    used = await pipe.execute() if done else []
    wf_b = sum(int(u or 0) for u in used) / max(1, sum(n for _, n in done))
    naive = _bytes_per_rate(red, s)
    cfg = s.daemon
    return {
        "decision_bytes_per_decision": dec_b,
        "workflow_bytes_per_decision": wf_b,
        "workflows_measured": len(done),
        "workflow_bytes_per_decision_all_keys": naive["workflow_bytes_per_decision"],
        "decision_ttl_s": cfg.decision_ttl_s,
        "workflow_ttl_s": cfg.workflow_ttl_s,
        "bytes_per_decision_per_s": dec_b * cfg.decision_ttl_s + wf_b * cfg.workflow_ttl_s,
        "decision_log_cap_bytes": cfg.decision_log_max_mb * MiB,
    }


def cpu_cores(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Per process sampled, the CPU cores it used between the first and last of `samples`."""
    if len(samples) < 2:
        return {}
    a, b = samples[0], samples[-1]
    return {
        k.removesuffix("_cpu_s"): (b[k] - a[k]) / max(1e-9, b["t"] - a["t"])
        for k in a
        if k.endswith("_cpu_s") and a[k] is not None and b.get(k) is not None
    }


def _met(key: str, value: float | None, bound: float) -> bool | None:
    if value is None:
        return None
    return bool(value >= bound if key in AT_LEAST else value <= bound)


def _starts(t0: float, t1: float, step: float) -> list[float]:
    """Starts of the whole steps of `step` from `t0` that end by `t1` (a last shorter one
    only when nothing else fits)."""
    n = max(1, int((t1 - t0 + 1e-9) // step))
    return [t0 + i * step for i in range(n)]


def _mib(x: float | None) -> float | None:
    return None if x is None else x / MiB


def _fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


# -- the summary ------------------------------------------------------------------------------


def growth(samples: list[dict[str, Any]], key: str, t_from: float, t_to: float) -> dict[str, Any]:
    """A process's RSS (or any sampled size) over [t_from, t_to]: first and last sample, the
    growth between them and a least-squares slope."""
    pts = [(x["t"], x[key]) for x in samples if t_from <= x["t"] <= t_to and x.get(key)]
    if len(pts) < 2:
        return {"samples": len(pts)}
    t, v = np.array(pts, dtype=float).T
    slope = float(np.polyfit(t, v, 1)[0]) if len(pts) >= 3 else (v[-1] - v[0]) / (t[-1] - t[0])
    return {
        "samples": len(pts), "from_t": t[0], "to_t": t[-1], "start": int(v[0]), "end": int(v[-1]),
        "max": int(v.max()), "growth": (v[-1] - v[0]) / v[0], "slope_mib_per_min": slope * 60 / MiB,
    }  # fmt: skip


def summarize(doc: dict[str, Any], s: Settings) -> dict[str, Any]:
    """The headline numbers, and each target: measured, bound, met."""
    st = doc["setup"]
    w, end = st["warmup_s"], st["seconds"]
    end += 1.0  # the load's last sample is taken just after it ends
    rss = {p: growth(doc["samples"], f"{p}_rss", w, end) for p in ("daemon", "updater")}
    rss_all = growth(doc["samples"], "daemon_rss", 0, end)
    redis_mem = growth(doc["samples"], "redis_used_memory", w, end)
    decided = [(x["t"], x["decided"]) for x in doc["samples"] if w <= x["t"] <= end]
    if len(decided) >= 2 and decided[-1][1] > decided[0][1] and redis_mem.get("samples", 0) >= 2:
        # Redis bytes added per decision after the warm-up (the decision log included while
        # it is under its cap)
        redis_mem["bytes_per_decision"] = (redis_mem["end"] - redis_mem["start"]) / (
            decided[-1][1] - decided[0][1]
        )
    windows = doc["windows"]
    first, last = (windows[0], windows[-1]) if windows else ({}, {})
    p99_ratio = (
        last["p99_ms"] / first["p99_ms"] if first.get("p99_ms") and last.get("p99_ms") else None
    )
    red = doc["redis"]
    per_rate = red["bytes_per_decision_per_s"]
    cfg = s.daemon
    bound = DOC_DECISION_B * cfg.decision_ttl_s + DOC_WORKFLOW_B * cfg.workflow_ttl_s
    declog = sum(v["bytes"] for f, v in red["families"].items() if f == "declog")
    cap = cfg.decision_log_max_mb * MiB
    counts = doc["counts"]
    measured = {
        "rss_growth": rss["daemon"].get("growth"),
        "p99_last_vs_first": p99_ratio,
        "redis_bytes_per_decision_per_s": per_rate["bytes_per_decision_per_s"],
        "decision_log_vs_cap": declog / cap if cap else 0.0,
        "ledgers_left": doc["ledgers_left"],
        "lost": counts["lost"],
        "dead_letters": counts["dead_letters"],
        "lag_p99_s": doc["lag"]["p99_s"],
        "decided_vs_offered": (
            last["decided_per_s"] / st["rate"] if last.get("decided_per_s") is not None else None
        ),
    }
    bounds = {**TARGETS, "redis_bytes_per_decision_per_s": bound}
    targets = {k: {"measured": v, "bound": bounds[k], "met": _met(k, v, bounds[k])}
               for k, v in measured.items()}  # fmt: skip
    return {
        "offered_per_s": doc["offered_per_s"],
        "cpu_cores": cpu_cores([x for x in doc["samples"] if x["t"] <= end]),
        "cpu_cores_first_window": first.get("cpu_cores"),
        "cpu_cores_last_window": last.get("cpu_cores"),
        "decided_per_s_last_window": last.get("decided_per_s"),
        "daemon_rss": rss["daemon"],
        "daemon_rss_whole_run": rss_all,
        "updater_rss": rss["updater"],
        "redis_used_memory": redis_mem,
        "redis_mib_per_decision_per_s": per_rate["bytes_per_decision_per_s"] / MiB,
        "doc_mib_per_decision_per_s": bound / MiB,
        "decision_log_bytes": declog,
        "p99_ms_first_window": first.get("p99_ms"),
        "p99_ms_last_window": last.get("p99_ms"),
        "targets": targets,
        "targets_met": all(t["met"] for t in targets.values()),
    }


# -- tables and chart -------------------------------------------------------------------------


def show(doc: dict[str, Any], console: Console) -> None:
    st, sm = doc["setup"], doc["summary"]
    t = Table(title=f"Soak: {st['rate']:,.0f} tasks/s offered for {st['seconds'] / 60:g} min "
                    f"(one daemon serving the champion, one updater)")  # fmt: skip
    for col in ("minutes", "decided/s", "p50 ms", "p99 ms", "max ms", "lag p99 / max s",
                "daemon RSS MiB", "updater RSS MiB", "Redis MiB",
                "CPU daemon / updater / broker"):  # fmt: skip
        t.add_column(col, justify="right")
    for p in doc["periods"]:
        warm = " (warm-up)" if p["to_s"] <= st["warmup_s"] + 1e-9 else ""
        t.add_row(
            f"{p['from_s'] / 60:.1f}-{p['to_s'] / 60:.1f}{warm}", _fmt(p["decided_per_s"], 0),
            _fmt(p["p50_ms"]), _fmt(p["p99_ms"]), _fmt(p["max_ms"]),
            f"{_fmt(p['lag_p99_s'], 2)} / {_fmt(p['lag_max_s'], 2)}",
            _fmt(_mib(p["daemon_rss"])), _fmt(_mib(p["updater_rss"])),
            _fmt(_mib(p["redis_used_memory"])),
            " / ".join(_fmt(p["cpu_cores"].get(k), 2) for k in ("daemon", "updater", "broker")),
        )  # fmt: skip
    console.print(t)
    wt = Table(title="Windows after the warm-up (by send time)")
    for col in ("minutes", "decided/s", "p50 ms", "p99 ms", "max ms"):
        wt.add_column(col, justify="right")
    for p in doc["windows"]:
        wt.add_row(f"{p['from_s'] / 60:.2f}-{p['to_s'] / 60:.2f}", _fmt(p["decided_per_s"], 0),
                   _fmt(p["p50_ms"]), _fmt(p["p99_ms"]), _fmt(p["max_ms"]))  # fmt: skip
    console.print(wt)
    c = doc["counts"]
    console.print(
        f"offered {c['offered']:,} tasks ({sm['offered_per_s']:,.0f}/s) of {c['workflows']:,} "
        f"workflows ({c['workflows_done']:,} done, {c['workflows_given_up']:,} given up), "
        f"decided {c['decided']:,} ({', '.join(f'{k} {v:,}' for k, v in c['arms'].items())}), "
        f"retries {c['retries']:,}, events {c['events']:,}; duplicates {c['duplicates']:,}, "
        f"dead letters {c['dead_letters']:,}, lost {c['lost']:,}"
    )
    r, pr = doc["redis"], doc["redis"]["bytes_per_decision_per_s"]
    rt = Table(title="Redis after the drain: bytes per decision by key family")
    for col in ("family", "keys", "MiB", "bytes/decision"):
        rt.add_column(col, justify="right")
    for fam, v in r["families"].items():
        rt.add_row(fam, f"{v['keys']:,}", _fmt(v["bytes"] / MiB),
                   _fmt(v["bytes"] / max(1, r["decisions"]), 0))  # fmt: skip
    console.print(rt)
    console.print(
        f"held at a sustained rate: {pr['decision_bytes_per_decision']:,.0f} B x decision_ttl_s "
        f"{pr['decision_ttl_s']:,} s + {pr['workflow_bytes_per_decision']:,.0f} B (the "
        f"{pr['workflows_measured']:,} latest workflows done) x "
        f"workflow_ttl_s {pr['workflow_ttl_s']:,} s = {sm['redis_mib_per_decision_per_s']:.2f} "
        f"MiB per (decision/s) (the docs: {sm['doc_mib_per_decision_per_s']:.2f}), plus the "
        f"decision log ({sm['decision_log_bytes'] / MiB:,.0f} MiB now, cap "
        f"{pr['decision_log_cap_bytes'] / MiB:,.0f} MiB)"
    )
    tt = Table(title="Targets")
    for col in ("target", "measured", "bound", "met"):
        tt.add_column(col, justify="right")
    for k, v in sm["targets"].items():
        m, b = v["measured"], v["bound"]
        if k == "rss_growth":
            m, b = _pct(m), f"<= {_pct(b)}"
        elif k == "redis_bytes_per_decision_per_s":
            m, b = _fmt(_mib(m), 2) + " MiB", f"<= {_fmt(_mib(b), 2)} MiB"
        elif k in ("p99_last_vs_first", "decision_log_vs_cap", "lag_p99_s"):
            m, b = _fmt(m, 2), f"<= {b:g}"
        elif k in AT_LEAST:
            m, b = _fmt(m, 2), f">= {b:g}"
        else:
            m, b = "-" if m is None else f"{m:,}", f"<= {b}"
        tt.add_row(k, m, b, {True: "yes", False: "no", None: "-"}[v["met"]])
    console.print(tt)
    d = sm["daemon_rss"]
    if "start" in d:
        console.print(
            f"daemon RSS after the warm-up {d['start'] / MiB:,.1f} -> {d['end'] / MiB:,.1f} MiB "
            f"({_pct(d['growth'])}, {d['slope_mib_per_min']:+.2f} MiB/min); whole run "
            f"{sm['daemon_rss_whole_run']['start'] / MiB:,.1f} -> "
            f"{sm['daemon_rss_whole_run']['end'] / MiB:,.1f} MiB; load average "
            f"{st['load_avg_start'][0]:.2f} at start, {st['load_avg_end'][0]:.2f} at end, "
            f"{st['cpus']} CPUs"
        )
    console.print("CPU cores used during the load: " + ", ".join(
        f"{k} {v:.2f}" for k, v in sm["cpu_cores"].items()))  # fmt: skip


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1%}"


def plot(path: Path, doc: dict[str, Any]) -> None:
    """RSS, Redis memory and latency (p50, p99 per period; the updater's lag) over time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    st = doc["setup"]
    fig = Figure(figsize=(9, 10), layout="constrained")
    FigureCanvasAgg(fig)
    ax_rss, ax_red, ax_cpu, ax_lat = fig.subplots(4, 1, sharex=True)
    smp = doc["samples"]
    t = [x["t"] / 60 for x in smp]
    for key, label in (("daemon_rss", "daemon"), ("updater_rss", "updater")):
        ax_rss.plot(t, [(x[key] or 0) / MiB for x in smp], marker=".", label=label)
    ax_rss.set_ylabel("RSS (MiB)")
    ax_red.plot(t, [x["redis_used_memory"] / MiB for x in smp], color="tab:red", marker=".")
    ax_red.set_ylabel("Redis used_memory (MiB)")
    for name in ("daemon", "updater", "broker", "redis", "bench"):
        pts = [((a["t"] + b["t"]) / 120, cpu_cores([a, b]).get(name))
               for a, b in itertools.pairwise(smp)]  # fmt: skip
        pts = [(x, y) for x, y in pts if y is not None]
        if pts:
            ax_cpu.plot(*zip(*pts, strict=True), marker=".", label=name)
    ax_cpu.set_ylabel("CPU (cores)")
    ax_cpu.legend(loc="upper left", fontsize=8, ncols=5)
    mid = [(p["from_s"] + p["to_s"]) / 120 for p in doc["periods"]]
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        ax_lat.plot(mid, [p[key] for p in doc["periods"]], marker="o", ms=3, label=label)
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel(f"latency (ms, per {st['period_s']:g} s sent)")
    lag = doc["lag_series"]
    if lag:
        twin = ax_lat.twinx()
        twin.plot([x[0] / 60 for x in lag], [x[1] for x in lag], color="tab:gray", lw=0.6,
                  alpha=0.7, label="updater lag")  # fmt: skip
        twin.set_ylabel("updater lag (s)")
        twin.legend(loc="upper right", fontsize=8)
    for ax in (ax_rss, ax_red, ax_cpu, ax_lat):
        ax.axvline(st["warmup_s"] / 60, color="k", ls=":", lw=0.8)
        ax.grid(alpha=0.3)
    ax_rss.legend(loc="lower right", fontsize=8)
    ax_lat.legend(loc="upper left", fontsize=8)
    ax_lat.set_xlabel("minutes since the load started (dotted: end of the warm-up)")
    ax_rss.set_title(f"soak: {st['rate']:,.0f} tasks/s offered, {st['seconds'] / 60:g} min, "
                     f"commit {st['git']['commit'][:7]}")  # fmt: skip
    fig.savefig(path, dpi=110)


# -- main -------------------------------------------------------------------------------------


async def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    load0 = os.getloadavg()
    wall0 = time.monotonic()
    async with local_stack(
        "redis://127.0.0.1:1/0", name="soak", say=console.log, private_redis=True,
        bootstrap=args.bootstrap,
    ) as stack:  # fmt: skip
        doc = await Soak(args, console).run(stack.settings)
        settings = stack.settings
    doc["setup"] = {
        "quick": args.quick, "rate": args.rate, "seconds": args.seconds,
        "linger_ms": args.linger_ms,
        "broker": "kafka at --bootstrap" if args.bootstrap else "embedded (Tansu)",
        "warmup_s": args.warmup_s, "window_s": args.window_s, "period_s": args.period_s,
        "sample_s": SAMPLE_S, "lag_sample_s": LAG_S, "drain_s": args.drain_s,
        "decision_ttl_s": settings.daemon.decision_ttl_s,
        "workflow_ttl_s": settings.daemon.workflow_ttl_s,
        "decision_log_max_mb": settings.daemon.decision_log_max_mb,
        "cpus": os.cpu_count(), "python": platform.python_version(),
        "load_avg_start": load0, "load_avg_end": os.getloadavg(),
        "wall_s": time.monotonic() - wall0, "git": git_state(),
    }  # fmt: skip
    doc["summary"] = summarize(doc, settings)
    return doc


def main() -> None:
    """Parse the options, run, print the tables, write the JSON and the chart."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=None, help="of load (default 30; quick 2)")
    ap.add_argument("--rate", type=float, default=1000.0, help="tasks/s offered")
    ap.add_argument("--quick", action="store_true", help="2 minutes of load, ~3 minutes in all")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--out", type=Path, default=None, help="the JSON (the chart beside it)")
    ap.add_argument("--linger-ms", type=float, default=LINGER_MS,
                    help="the load's producer (job queue and cluster): linger.ms")  # fmt: skip
    ap.add_argument("--bootstrap", default=None,
                    help="HOST:PORT of a Kafka to use instead of the embedded broker")  # fmt: skip
    args = ap.parse_args()
    minutes = args.minutes or (2.0 if args.quick else 30.0)
    args.seconds = max(3 * SLOT_S, round(minutes * 60 / SLOT_S) * SLOT_S)
    args.period_s = 30.0 if args.quick or args.seconds < 600 else 60.0
    # warm-up: the first third; the rest cut into four windows (whole latency slots)
    args.warmup_s = round(args.seconds / 3 / SLOT_S) * SLOT_S
    args.window_s = max(SLOT_S, (args.seconds - args.warmup_s) // 4 // SLOT_S * SLOT_S)
    args.drain_s = 30.0 if args.quick else 120.0
    name = "soak_quick.json" if args.quick else "soak.json"
    out = args.out or REPO / "bench" / "results" / name
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    console = Console(stderr=True, width=140)
    doc = asyncio.run(run(args, console))
    doc["command"] = " ".join(["python bench/soak.py", *sys.argv[1:]])
    show(doc, console if args.json else Console(width=140))
    written = write_results(out, doc, default=float)
    plot(out.with_suffix(".png"), doc)
    console.log(f"wrote {out} and {out.with_suffix('.png').name}")
    if args.json:
        print(json.dumps(written, default=float))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
