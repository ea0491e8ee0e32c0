"""The analysis of `bench/switch_time.py`: from the replicas' log lines, the decisions read
back from the topics and the promotions' times, each switch's times per replica and the run's
integrity (lost, decided twice, served by a version not allowed at its time), as the JSON
document the bench writes. Kept apart from the experiment (switch_time.py), which runs it."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
from collections import defaultdict
from typing import Any

from dagsched.settings import Settings
from harness.replicas import Replica
from harness.stack import git_state
from harness.watch import Decision, Watch

TARGET_S = 1.0
MISSED_NOTICE_S = 2.0  # a load this long after the notice came from the poll


def _first(items: list[float], after: float, before: float) -> float | None:
    found = [t for t in items if after <= t < before]
    return min(found) if found else None


def analyse(
    args: argparse.Namespace,
    s: Settings,
    replicas: list[Replica],
    watch: Watch,
    switches: list[dict[str, Any]],
    replays: list[dict[str, Any]],
    versions: tuple[str, str],
) -> dict[str, Any]:
    """The JSON document: per-switch times, the integrity checks, and the setup measured."""
    inf = float("inf")

    def owner(key: tuple[str, int, int], d: Decision) -> int | None:
        """The replica that held the decision's partition at `decided_at` (None: unclear)."""
        part = watch.wf_partition.get(key[0], d.partition)
        held = [r.index for r in replicas if part in r.owner_at(d.decided_at)]
        return held[0] if len(held) == 1 else None

    # every decision record: (key, decision, replica)
    flat = [(k, d, owner(k, d)) for k, ds in watch.decisions.items() for d in ds]

    for i, sw in enumerate(switches):
        t0 = sw["t0"]
        nxt = switches[i + 1]["t0"] if i + 1 < len(switches) else inf
        per: list[dict[str, Any]] = []
        for r in replicas:
            swap = _first([t for t, _, new in r.swaps if new == sw["to"]], t0, nxt)
            loaded = _first([t for t, v in r.loads if v == sw["to"]], t0, nxt)
            notice = _first(r.notices, t0, nxt)
            first = _first(
                [d.decided_at for _, d, o in flat if o == r.index and d.version == sw["to"]],
                t0,
                nxt,
            )
            per.append(
                {
                    "replica": r.index,
                    "notice_received_s": None if notice is None else notice - t0,
                    "loaded_s": None if loaded is None else loaded - t0,
                    "switch_s": None if swap is None else swap - t0,
                    "first_decision_s": None if first is None else first - t0,
                    "loaded_to_swapped_s": None
                    if swap is None or loaded is None
                    else swap - loaded,
                    "via": _via(notice, loaded),
                    "t_swapped": swap,
                }
            )
        sw["replicas"] = per
        times = [p["switch_s"] for p in per]
        sw["switch_s"] = None if None in times else max(times)
        firsts = [p["first_decision_s"] for p in per]
        sw["first_decision_s"] = None if None in firsts else max(firsts)
        sw["t_all_swapped"] = None if sw["switch_s"] is None else t0 + sw["switch_s"]
        sent = sw["t_notice_sent"]
        sw["alias_to_notice_s"] = None if sent is None else sent - t0

    # integrity: lost, decided twice, and the version each decision may name
    asked, decided = watch.asked, set(watch.decisions)
    lost = sorted(asked - decided)
    twice = sorted(k for k, ds in watch.decisions.items() if len({d.raw for d in ds}) > 1)
    reemits = sum(len(ds) - 1 for ds in watch.decisions.values())
    old = f"v{versions[0]}"
    bad_version: list[dict[str, Any]] = []
    for key, d, o in flat:
        allowed = {old}
        for sw in switches:
            if d.decided_at < sw["t0"]:
                break
            mine = [p["t_swapped"] for p in sw["replicas"] if p["replica"] == o]
            swap = mine[0] if mine else sw["t_all_swapped"]  # unattributed: all must have swapped
            if swap is not None and d.decided_at >= swap:
                allowed = {sw["to"]}
            else:
                allowed = allowed | {sw["to"]}
        if d.arm != "champion" or d.version not in allowed:
            bad_version.append(
                {"key": list(key), "version": d.version, "arm": d.arm, "replica": o,
                 "decided_at": d.decided_at, "allowed": sorted(allowed)}
            )  # fmt: skip
    by_version: dict[str, int] = defaultdict(int)
    by_replica: dict[str, int] = defaultdict(int)
    for _, d, o in flat:
        by_version[f"{d.arm}:{d.version}"] += 1
        by_replica["unattributed" if o is None else f"daemon {o}"] += 1
    partition_mismatch = sum(
        1
        for (wf, _, _), d, _ in flat
        if wf in watch.wf_partition and d.partition != watch.wf_partition[wf]
    )
    failed = [r for r in replays if "error" in r]
    incomplete = [r for r in replays if "error" not in r and r["workflows_ended"] != args.workflows]

    done = [sw["switch_s"] for sw in switches if sw["switch_s"] is not None]
    firsts = [sw["first_decision_s"] for sw in switches if sw["first_decision_s"] is not None]
    per_replica = [
        p["switch_s"] for sw in switches for p in sw["replicas"] if p["switch_s"] is not None
    ]
    summary = {
        "switches": len(switches),
        "switched": len(done),
        "switch_s_p50": statistics.median(done) if done else None,
        "switch_s_max": max(done) if done else None,
        "switch_s_mean": statistics.fmean(done) if done else None,
        "per_replica_switch_s_p50": statistics.median(per_replica) if per_replica else None,
        "alias_to_notice_s_p50": _median([sw["alias_to_notice_s"] for sw in switches]),
        "notice_to_swapped_s_p50": _median(
            [p["switch_s"] - p["notice_received_s"] for sw in switches for p in sw["replicas"]
             if p["switch_s"] is not None and p["notice_received_s"] is not None]
        ),
        "loaded_to_swapped_s_p50": _median(
            [p["loaded_to_swapped_s"] for sw in switches for p in sw["replicas"]]
        ),
        "loads_via": {
            str(v or "no load"): sum(p["via"] == v for sw in switches for p in sw["replicas"])
            for v in ("notice", "poll", "poll (notice missed)", None)
        },
        "first_decision_s_p50": statistics.median(firsts) if firsts else None,
        "first_decision_s_max": max(firsts) if firsts else None,
        "within_target": sum(t <= TARGET_S for t in done),
        "target_s": TARGET_S,
        "meets_target": bool(done) and len(done) == len(switches) and max(done) <= TARGET_S,
    }  # fmt: skip
    integrity = {
        "task_ready_messages": watch.ready_msgs,
        "tasks_asked": len(asked),
        "tasks_decided": len(decided),
        "decision_records": watch.records,
        "decisions_by_version": dict(by_version),
        "decisions_by_replica": dict(by_replica),
        "lost": len(lost),
        "lost_examples": [list(k) for k in lost[:10]],
        "decided_without_ask": len(decided - asked),
        "identical_reemits": reemits - len(twice),
        "decided_twice": len(twice),
        "decided_twice_examples": [list(k) for k in twice[:10]],
        "wrong_version": len(bad_version),
        "wrong_version_examples": bad_version[:10],
        "decision_partition_differs_from_task_partition": partition_mismatch,
        "undecodable_records": watch.undecodable,
        "replays": len(replays),
        "replays_failed": len(failed),
        "replays_incomplete": len(incomplete),
        "workflows_replayed": sum(r.get("workflows_ended") or 0 for r in replays),
        "ok": not (lost or twice or bad_version or failed or incomplete),
    }
    return {
        "benchmark": "switch_time",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "setup": {
            "replicas": "separate `dagsched daemon` processes (python -m dagsched.cli.main daemon)",
            "daemons": args.daemons,
            "switches_requested": args.switches,
            "interval_s": args.interval,
            "experiment_early_notice": args.early_notice,
            "experiment_torch_threads": args.torch_threads,
            "workflows_per_replay": args.workflows,
            "partitions": s.topics.partitions,
            "reload_poll_s": s.daemon.reload_poll_s,
            "batch_max": s.daemon.batch_max,
            "batch_wait_ms": s.daemon.batch_wait_ms,
            "fetch_max_wait_ms": s.daemon.fetch_max_wait_ms,
            "cluster_nodes": s.sim.cluster.n_nodes,
            "profile": "code defaults + configs/default.yaml",
            "broker": "embedded Tansu (memory)",
            "registry": "MLflow SQLite in a temporary home",
            "versions": {
                "old": f"{old} (shipped champion)",
                "new": f"v{versions[1]} (shipped + N(0, 0.01) on cont_head)",
            },
            "t0": "time.time() right after Registry.set_alias('champion') returns in promote",
            "serving": "the replica's model.swapped log line (its next batch uses the version)",
            "git": git_state(),
            "python": platform.python_version(),
            "machine": platform.machine(),
            "cpu_count": os.cpu_count(),
            "load_avg_1m_end": os.getloadavg()[0],
        },
        "summary": summary,
        "integrity": integrity,
        "switches": switches,
        "replays": replays,
        "assignments": [
            {"replica": r.index, "assignments": [[a, sorted(p)] for a, p in r.assignments]}
            for r in replicas
        ],
        "replica_warnings": [{"replica": r.index, **p} for r in replicas for p in r.problems[:20]],
    }


def _via(notice: float | None, loaded: float | None) -> str | None:
    """What made the replica load: the Redis notice, or its poll (a late load after a notice
    means the notice did not wake the check)."""
    if loaded is None:
        return None
    if notice is None or loaded < notice:
        return "poll"
    return "poll (notice missed)" if loaded - notice > MISSED_NOTICE_S else "notice"


def _median(xs: list[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


# -- output ---------------------------------------------------------------------------------


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"
