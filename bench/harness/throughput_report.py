"""The daemon throughput bench's measures and tables: decisions/s over a backlog, Redis bytes
per decision by key family, a replica's counters and CPU time, the summary against the
throughput targets, and the printed tables."""

from __future__ import annotations

import contextlib
import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from dagsched.settings import Settings
from harness.kafka_io import Key, Reader

RATES = (200, 1000, 5000)
TARGETS = {
    "gnn_per_s": 5000.0,
    "gnn_vs_passthrough": 0.5,
    "p99_ms_at_1000": 30.0,
    "p99_ms_at_5000": 100.0,
    "p99_ms_at_1000_2_replicas": 30.0,
    "p99_ms_at_5000_2_replicas": 100.0,
    "served_per_s_32_nodes": 10_000.0,
    "served_per_s_2048_nodes": 1000.0,
    # the event side: three events per decision at 5,000 decisions/s; the updater's lag
    # behind the newest event with 1,000 tasks/s offered through the daemon
    "events_per_s": 15_000.0,
    "updater_lag_max_s_at_1000": 1.0,
}
LOWER_IS_BETTER = ("p99", "updater_lag")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of process `pid` so far (Linux; None elsewhere or once gone).
    On a shared machine the replicas' CPU time per decision is steadier than decisions/s."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_per_decision(samples: list[tuple[int, float]], total: int) -> float | None:
    """Microseconds of the replicas' CPU per decision between the looks nearest 10% and 90%
    of `total` decided (start-up and the tail left out, as in decisions/s)."""
    mid = [(d, c) for d, c in samples if 0.1 * total <= d <= 0.9 * total]
    if len(mid) < 2 or mid[-1][0] <= mid[0][0]:
        return None
    return (mid[-1][1] - mid[0][1]) / (mid[-1][0] - mid[0][0]) * 1e6


def stopped_stats(log: Path) -> dict[str, Any]:
    """The counters of the replica's `daemon.stopped` line (decisions, duplicates, ...)."""
    out: dict[str, Any] = {}
    with contextlib.suppress(OSError):
        for line in log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                ev = json.loads(line)
                if ev.get("event") == "daemon.stopped":
                    out = {k: v for k, v in ev.items() if isinstance(v, int)}
    return out


def saturation(reader: Reader, keys: list[Key], complete: bool, started: float) -> dict[str, Any]:
    """Decisions/s over the middle 80% of the backlog's decisions, and all-in."""
    got = [reader.arrived[k] for k in keys if k in reader.arrived]
    times = np.sort(np.array([t for t, _ in got]))
    arms: dict[str, int] = defaultdict(int)
    for _, arm in got:
        arms[arm] += 1
    out: dict[str, Any] = {"decided": len(got), "complete": complete, "arms": dict(arms)}
    if len(times) >= 10:
        lo, hi = int(0.1 * len(times)), int(0.9 * len(times)) - 1
        out["per_s"] = (hi - lo) / max(1e-9, times[hi] - times[lo])
        out["per_s_all"] = (len(times) - 1) / max(1e-9, times[-1] - times[0])
        out["first_decision_s"] = times[0] - started
        out["drain_s"] = times[-1] - times[0]
    return out


async def redis_bytes(rds: Any, s: Settings, decisions: int, mem0: int) -> dict[str, Any]:
    """MEMORY USAGE of every key under the configuration's prefix, by key family."""
    prefix = f"{s.topic_prefix}dagsched:"
    keys = [k async for k in rds.scan_iter(match=f"{prefix}*", count=2000)]
    by: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i in range(0, len(keys), 1000):
        pipe = rds.pipeline(transaction=False)
        for k in keys[i : i + 1000]:
            pipe.memory_usage(k, samples=0)
        for k, used in zip(keys[i : i + 1000], await pipe.execute(), strict=True):
            family = k.decode()[len(prefix) :].split(":")[0]
            by[family][0] += 1
            by[family][1] += int(used or 0)
    total = sum(b for _, b in by.values())
    mem1 = (await rds.info("memory"))["used_memory"]
    return {
        "decisions": decisions,
        "keys": len(keys),
        "bytes": total,
        "bytes_per_decision": total / max(1, decisions),
        "used_memory_delta_per_decision": (mem1 - mem0) / max(1, decisions),
        "families": {f: {"keys": c, "bytes": b} for f, (c, b) in sorted(by.items())},
    }


def _rate(doc: dict[str, Any], name: str) -> float | None:
    c = doc["configs"].get(name)
    return None if c is None else c.get("saturation", {}).get("per_s")


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers and which targets they meet."""
    out: dict[str, Any] = {
        "passthrough_per_s": _rate(doc, "passthrough"),
        "heuristic_per_s": _rate(doc, "heuristic"),
        "gnn_per_s": _rate(doc, "gnn"),
        "gnn_2_replicas_per_s": _rate(doc, "gnn2"),
    }
    lat = doc["configs"].get("gnn", {}).get("latency", {})
    for rate in RATES:
        out[f"p50_ms_at_{rate}"] = lat.get(str(rate), {}).get("p50_ms")
        out[f"p99_ms_at_{rate}"] = lat.get(str(rate), {}).get("p99_ms")
    # as deployed: two replicas sharing the topic's partitions and the cores
    lat2 = doc["configs"].get("gnn2", {}).get("latency", {})
    for rate in RATES:
        out[f"p50_ms_at_{rate}_2_replicas"] = lat2.get(str(rate), {}).get("p50_ms")
        out[f"p99_ms_at_{rate}_2_replicas"] = lat2.get(str(rate), {}).get("p99_ms")
    for row in doc["served"]:
        out[f"served_per_s_{row['nodes']}_nodes"] = row["per_s"]
    red = doc["configs"].get("gnn", {}).get("redis") or doc["configs"].get("heuristic", {}).get(
        "redis"
    )
    out["redis_bytes_per_decision"] = red["bytes_per_decision"] if red else None
    best = max((x for x in (out["gnn_per_s"], out["gnn_2_replicas_per_s"]) if x), default=None)
    ratio = best / out["passthrough_per_s"] if best and out["passthrough_per_s"] else None
    out["gnn_vs_passthrough"] = ratio
    checks = {
        "gnn_per_s": best,
        "gnn_vs_passthrough": ratio,
        "p99_ms_at_1000": out["p99_ms_at_1000"],
        "p99_ms_at_5000": out["p99_ms_at_5000"],
        "p99_ms_at_1000_2_replicas": out["p99_ms_at_1000_2_replicas"],
        "p99_ms_at_5000_2_replicas": out["p99_ms_at_5000_2_replicas"],
        "served_per_s_32_nodes": out.get("served_per_s_32_nodes"),
        "served_per_s_2048_nodes": out.get("served_per_s_2048_nodes"),
    }
    ev = doc.get("events", {})
    upd, loop = ev.get("updater", {}), ev.get("closedloop", {})
    out["events_per_s"] = upd.get("per_s")
    out["events_vs_passthrough"] = (
        upd["per_s"] / out["passthrough_per_s"]
        if upd.get("per_s") and out["passthrough_per_s"]
        else None
    )
    out["updater_lag_p99_s_at_1000"] = loop.get("lag", {}).get("p99_s")
    out["updater_lag_max_s_at_1000"] = loop.get("lag", {}).get("max_s")
    out["ledgers_left"] = [x["ledgers_left"] for x in (upd, loop) if "ledgers_left" in x]
    per_rate = loop.get("redis", {}).get("bytes_per_decision_per_s", {})
    out["redis_bytes_per_decision_per_s"] = per_rate.get("bytes_per_decision_per_s")
    checks["events_per_s"] = out["events_per_s"]
    checks["updater_lag_max_s_at_1000"] = out["updater_lag_max_s_at_1000"]
    out["targets_met"] = {
        k: None if v is None else bool(v <= TARGETS[k] if _lower(k) else v >= TARGETS[k])
        for k, v in checks.items()
    }
    return out


def _lower(k: str) -> bool:
    return k.startswith(LOWER_IS_BETTER)


def fmt_events(u: dict[str, Any]) -> str:
    """The updater's saturation line."""
    if "per_s" not in u:
        return f"{u['applied']:,} of {u['events']:,} events applied"
    return (
        f"{u['per_s']:,.0f} events/s ({u.get('per_s_all', 0):,.0f}/s all-in, "
        f"{u['applied']:,} applied, CPU {u.get('cpu_us_per_event', 0):,.1f} us/event, "
        f"{u['ledgers_left']} ledgers left)"
    )


def show_events(doc: dict[str, Any], console: Console) -> None:
    """The event side's table."""
    ev = doc.get("events", {})
    if not ev:
        return
    pt = doc["configs"].get("passthrough", {}).get("saturation", {}).get("per_s")
    t = Table(title="Event side: the updater (three events per decision)")
    for col in ("phase", "events", "events/s", "vs passthrough", "CPU us/event",
                "lag p50 / p99 / max s", "ledgers left"):  # fmt: skip
        t.add_column(col, justify="right")
    u = ev.get("updater")
    if u:
        t.add_row(
            "saturation", f"{u['applied']:,} / {u['events']:,}", _n(u.get("per_s")),
            "-" if not (pt and u.get("per_s")) else f"{u['per_s'] / pt:.2f}",
            _n(u.get("cpu_us_per_event")), "-", str(u["ledgers_left"]),
        )  # fmt: skip
    c = ev.get("closedloop")
    if c:
        lag = c["lag"]
        where = "updater alone" if c.get("separate") else "daemon's updater"
        t.add_row(
            f"closed loop, {c.get('offered_per_s', 0):,.0f} tasks/s ({c['config']}, {where})",
            f"{c['events']:,}", _n(c["events"] / max(1e-9, c["wall_s"])), "-", "-",
            f"{lag.get('p50_s', 0):.3f} / {lag.get('p99_s', 0):.3f} / {lag.get('max_s', 0):.3f}",
            str(c["ledgers_left"]),
        )  # fmt: skip
    console.print(t)
    if c and "redis" in c:
        r = c["redis"]
        pr = r["bytes_per_decision_per_s"]
        rt = Table(title="Redis after the closed loop (every event applied): bytes per decision")
        for col in ("family", "keys", "bytes/decision"):
            rt.add_column(col, justify="right")
        for fam, v in r["families"].items():
            rt.add_row(fam, f"{v['keys']:,}", _n(v["bytes"] / max(1, r["decisions"])))
        console.print(rt)
        console.print(
            f"held: {pr['decision_bytes_per_decision']:,.0f} B per decision x decision_ttl_s "
            f"{pr['decision_ttl_s']:,} s + {pr['workflow_bytes_per_decision']:,.0f} B x "
            f"workflow_ttl_s {pr['workflow_ttl_s']:,} s = "
            f"{pr['bytes_per_decision_per_s'] / 2**20:,.1f} MiB per (decision/s), plus the "
            f"decision log's cap {pr['decision_log_cap_bytes'] / 2**20:,.0f} MiB"
        )


def fmt_rate(sat: dict[str, Any]) -> str:
    if "per_s" not in sat:
        return f"{sat['decided']} decided"
    us = sat.get("replica_cpu_us")
    cpu = "" if us is None else f", replica CPU {us:,.0f} us/decision"
    return (
        f"{sat['per_s']:,.0f}/s ({sat['per_s_all']:,.0f}/s all-in, {sat['decided']:,} decided{cpu})"
    )


def _n(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.0f}{unit}" if abs(x) >= 100 else f"{x:,.1f}{unit}"


def show(doc: dict[str, Any], console: Console) -> None:
    """The tables: configurations, latency, served path, Redis, targets."""
    t = Table(title="Daemon throughput: decisions/s at saturation (backlog published first)")
    cols = ("config", "replicas", "decisions/s", "all-in/s", "CPU us/dec", "decided", "arms",
            "Redis B/dec")  # fmt: skip
    for col in cols:
        t.add_column(col, justify="right")
    for name, c in doc["configs"].items():
        sat = c.get("saturation", {})
        red = c.get("redis")
        t.add_row(
            name, str(c["replicas"]), _n(sat.get("per_s")), _n(sat.get("per_s_all")),
            _n(sat.get("replica_cpu_us")),
            f"{sat.get('decided', 0):,} / {c['backlog_tasks']:,}",
            ", ".join(f"{k} {v:,}" for k, v in sorted(sat.get("arms", {}).items())),
            _n(red["bytes_per_decision"]) if red else "-",
        )  # fmt: skip
    console.print(t)
    lt = Table(title="Submit-to-decision latency (ms) at offered tasks/s: p50 / p99")
    lt.add_column("config")
    for rate in RATES:
        lt.add_column(f"{rate:,}/s", justify="right")
    for name, c in doc["configs"].items():
        if "latency" in c:
            cells = []
            for rate in RATES:
                r = c["latency"][str(rate)]
                tail = "" if r["complete"] else f" ({r['decided']:,}/{r['tasks']:,})"
                cells.append(f"{_n(r['p50_ms'])} / {_n(r['p99_ms'])}{tail}")
            lt.add_row(name, *cells)
    console.print(lt)
    st = Table(title="Served path alone: GNNScheduler.place, batches of 64")
    for col in ("nodes", "decisions/s", "ms per batch"):
        st.add_column(col, justify="right")
    for r in doc["served"]:
        st.add_row(str(r["nodes"]), _n(r["per_s"]), f"{r['ms_per_batch']:.1f}")
    console.print(st)
    for name, c in doc["configs"].items():
        red = c.get("redis")
        if not red:
            continue
        rt = Table(title=f"Redis after the backlog, {name}: bytes per decision by key family")
        for col in ("family", "keys", "bytes", "bytes/decision"):
            rt.add_column(col, justify="right")
        for fam, v in red["families"].items():
            rt.add_row(fam, f"{v['keys']:,}", f"{v['bytes']:,}", _n(v["bytes"] / red["decisions"]))
        rt.add_row("all", f"{red['keys']:,}", f"{red['bytes']:,}", _n(red["bytes_per_decision"]))
        console.print(rt)
    sm = doc["summary"]
    show_events(doc, console)
    tt = Table(title="Targets")
    for col in ("measure", "value", "target", "met"):
        tt.add_column(col, justify="right")
    for k, target in TARGETS.items():
        v = sm.get(k)
        if k == "gnn_per_s":
            v = max((x for x in (sm["gnn_per_s"], sm["gnn_2_replicas_per_s"]) if x), default=None)
        met = {True: "yes", False: "no"}.get(sm["targets_met"].get(k), "-")
        op = "<=" if _lower(k) else ">="
        tt.add_row(k, "-" if v is None else f"{v:,.2f}", f"{op} {target:,g}", met)
    console.print(tt)
    su = doc["setup"]
    console.print(
        f"load average (1/5/15 min) at start {su['load_avg_start'][0]:.2f} / "
        f"{su['load_avg_start'][1]:.2f} / {su['load_avg_start'][2]:.2f}, at end "
        f"{su['load_avg_end'][0]:.2f}; {su['cpus']} CPUs; wall {doc['wall_s']:.0f} s"
    )
