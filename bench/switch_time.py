"""Switch time: from the champion alias move until every daemon replica serves the new version,
under live traffic, with no task lost or decided twice.

Setup, all on this machine: the embedded Tansu broker, a Redis (`settings.redis_url` when it
answers, else a private `redis-server`), an MLflow SQLite registry in a temporary home
(champion `v1` = the shipped bundle; `v2` = the same bundle with its continuous head perturbed
by N(0, 0.01) noise), and `--daemons` replicas started as separate `dagsched daemon` processes
(one consumer group; code defaults + configs/default.yaml, so `daemon.reload_poll_s` is 5 s;
JSON logs on stderr). Each replica has its own home (its own bundle cache, as on its own host)
and reads the bench's MLflow store, so its first load of `v2` includes the bundle download.
The audit experiment is created before the first switch (a fresh store would otherwise pay
that once inside the first promotion). Traffic: back-to-back closed-loop replays
(`dagsched.daemon.replay`, as fast as decisions come, `--workflows` each) in a process of their
own (so the promotion does not share a GIL with the simulator), from before the first switch
until after the last; every replay must finish all of its workflows. The promotions run in
this process, with the reader of the topics and of the replicas' logs.

Each switch promotes the other version with `Promoter.promote` (v1 -> v2 -> v1 ...), started
`--interval` seconds after the previous alias move and only once every replica serves the
previous target. Times are wall clock (`time.time()`; one machine, one clock):

- t0: the moment `Registry.set_alias("champion", ...)` returns inside `promote`, i.e. the alias
  write has committed. `promote` then writes the audit record and only then publishes the
  Redis notice ("alias->notice" in the table).
- notice received, loaded, swapped: the replica's `model.notice`, `model.loaded` and
  `model.swapped` log lines (structlog ISO timestamps). Swapped is when the new version is
  installed between two batches: that replica's next batch is decided by it. This is
  "serving the new version".
- switch time of a replica = swapped - t0; switch time of a switch = the max over replicas.
- first decision: `decided_at` of the replica's first decision on `dagsched.decisions` naming
  the new version (depends on traffic reaching that replica). Decisions carry no replica id:
  a decision is attributed to the replica that owned its partition at `decided_at` (the daemon
  keys decisions by workflow id like the tasks; both topics have the same partitions; the
  replicas log their assignments).

Integrity, from `dagsched.tasks` and `dagsched.decisions` read from the beginning: every
(workflow, task, attempt) asked for has a decision (lost = none); none has two different
decisions (a byte-identical re-emit of the stored decision counts as a re-emit, not as
deciding twice); every decision names a version allowed at its `decided_at`: the old one
before t0, the new one once its replica swapped, either in between; every replay completes.

The stack, the replica processes, the topic reader and the traffic process are the shared
bench harness (bench/harness/), and so is the analysis (`harness/switch_analysis.py`); this
file holds the experiment and its tables.

Experiments (written to their own JSON files): `--early-notice` also publishes the notice
right after the alias write (the order proposed for `Promoter`); `--torch-threads N` sets
OMP_NUM_THREADS for the replicas.

    .venv/bin/python bench/switch_time.py [--switches 8] [--daemons 2] [--interval 2.5]
        [--workflows 12] [--out bench/results] [--early-notice] [--torch-threads N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from harness.replicas import Replica, start_replica, stop_replica, wait_until
from harness.results import write_results
from harness.stack import REPO, local_stack
from harness.switch_analysis import analyse, fmt_ms
from harness.traffic import Traffic
from harness.watch import Watch
from rich.console import Console
from rich.table import Table

from dagsched.settings import Settings

SWITCH_TIMEOUT_S = 20.0
DEFAULT_REDIS = "redis://127.0.0.1:6379/0"


# -- registry -------------------------------------------------------------------------------


def setup_registry(settings: Settings) -> tuple[Any, str, str]:
    """(registry that timestamps champion writes, v1 = shipped champion, v2 = perturbed)."""
    import torch

    from dagsched.policy.bundle import load_bundle, save_bundle
    from dagsched.registry.promotion import audit_experiment
    from dagsched.registry.store import CHAMPION, SHIPPED_CHAMPION, Registry

    class TimedRegistry(Registry):
        """Records `time.time()` right after each write of the champion alias returns."""

        champion_writes: list[tuple[float, str]]
        on_champion_write: Any = None  # called right after the write (--early-notice)

        def set_alias(self, alias: str, version: str) -> None:
            super().set_alias(alias, version)
            if alias == CHAMPION:
                self.champion_writes.append((time.time(), version))
                if self.on_champion_write is not None:
                    self.on_champion_write(version)

    reg = TimedRegistry(settings)
    reg.champion_writes = []
    v1 = reg.ensure_champion()
    assert v1 is not None, "the shipped champion did not register"
    audit_experiment(reg)  # created by the first promotion otherwise: not part of a switch
    sched = load_bundle(SHIPPED_CHAMPION, "shipped", smoke=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in sched.model.cont_head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.01)
    folder = settings.home / "bundle-v2"
    save_bundle(folder, sched.model, sched.normalizer)
    with reg.run("switch-bench-v2", {"source": "shipped + N(0, 0.01) on cont_head"}) as run:
        v2 = reg.register_bundle(
            folder,
            run.run_id,
            metrics={},
            parent=v1,
            data="bench/switch_time.py: perturbed shipped champion",
            first_is_champion=False,
        )
    return reg, v1, v2


# -- the run --------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Set up the stack, the registry and the replicas; switch under traffic; analyse."""
    from dagsched.registry.promotion import Promoter, redis_notifier
    from dagsched.registry.serving import model_channel

    console = Console(stderr=True)
    replicas: list[Replica] = []
    watch: Watch | None = None
    flow: Traffic | None = None
    wall0, load0 = time.monotonic(), os.getloadavg()[0]
    async with local_stack(
        args.redis_url, name="switch", keep_home=args.keep_home, say=console.log
    ) as stack:
        s, home = stack.settings, stack.home
        try:
            reg, v1, v2 = await asyncio.to_thread(setup_registry, s)
            console.log(f"registry: champion v{v1} (shipped), v{v2} (perturbed)")
            watch = Watch(s)
            await watch.start()
            pump = asyncio.create_task(watch.pump())
            replicas = [
                await start_replica(i, s, home, args.torch_threads) for i in range(args.daemons)
            ]
            n_parts = s.topics.partitions

            def ready() -> bool:
                held = [r.partitions for r in replicas]
                return (
                    all(r.serving == f"v{v1}" for r in replicas)
                    and all(held)
                    and len(frozenset().union(*held)) == n_parts
                    and sum(len(h) for h in held) == n_parts
                )

            await wait_until(
                ready, 180, "the replicas to serve v1 and share the partitions", replicas
            )
            console.log(
                "replicas ready: "
                + ", ".join(f"#{r.index} {sorted(r.partitions)}" for r in replicas)
                + f" ({time.monotonic() - wall0:.0f} s)"
            )

            notices: list[float] = []
            publish = redis_notifier(s, model_channel(s))

            def notify(message: str) -> None:
                notices.append(time.time())
                publish(message)

            promoter = Promoter(reg, notify=notify)
            if args.early_notice:  # the proposed order: the notice right after the alias write
                reg.on_champion_write = lambda v: notify(json.dumps({"version": v, "early": 1}))
            flow = Traffic(s, args.workflows)
            await flow.start()
            await wait_until(lambda: watch.ready_msgs > 0, 120, "the first task", replicas)
            await asyncio.sleep(args.interval)  # traffic flows before the first switch
            switches: list[dict[str, Any]] = []
            current, other = v1, v2
            for k in range(args.switches):
                if not flow.running:
                    break
                before = len(reg.champion_writes)
                t_call = time.time()
                await asyncio.to_thread(
                    promoter.promote,
                    other,
                    "switch-time benchmark",
                    "bench/switch_time.py",
                    {"switch": k},
                )
                t_return = time.time()
                t0, written = reg.champion_writes[before]
                assert written == other
                want = f"v{other}"

                def swapped(r: Replica, want: str = want, t0: float = t0) -> bool:
                    return any(t >= t0 and new == want for t, _, new in r.swaps)

                timed_out = False
                try:
                    await wait_until(
                        lambda: all(swapped(r) for r in replicas),
                        SWITCH_TIMEOUT_S,
                        f"switch {k} to {want}",
                        replicas,
                    )
                except TimeoutError:
                    timed_out = True
                switches.append(
                    {
                        "index": k,
                        "from": f"v{current}",
                        "to": want,
                        "t_call": t_call,
                        "t0": t0,
                        "t_notice_sent": min((n for n in notices if n >= t0), default=None),
                        "t_return": t_return,
                        "timed_out": timed_out,
                    }
                )
                console.log(f"switch {k}: v{current} -> {want}")
                current, other = other, current
                await asyncio.sleep(max(0.0, t0 + args.interval - time.time()))
            replays = await flow.finish()
            await asyncio.sleep(0.5)
            await watch.drain()
            pump.cancel()
            with contextlib.suppress(BaseException):
                await pump
            codes = [await stop_replica(r) for r in replicas]
            doc = analyse(args, s, replicas, watch, switches, replays, (v1, v2))
            doc["setup"]["daemon_exit_codes"] = codes
            doc["setup"]["redis"] = (
                "private redis-server" if stack.private_redis else "settings.redis_url"
            )
            doc["wall_s"] = round(time.monotonic() - wall0, 1)
            doc["setup"]["load_avg_1m_start"] = load0
            return doc
        finally:
            if flow is not None and flow.proc is not None and flow.running:
                flow.proc.kill()
                await flow.proc.wait()
            for r in replicas:
                await stop_replica(r)
            if watch is not None:
                await watch.close()


def show(doc: dict[str, Any]) -> None:
    """Print the per-switch table and the summary table."""
    console = Console()
    n = doc["setup"]["daemons"]
    table = Table(
        title="switch time (ms after the alias write): per replica swapped / first decision"
    )
    for col in (
        "#",
        "from -> to",
        "alias->notice",
        *[f"daemon {i}" for i in range(n)],
        "max",
        "first dec. max",
    ):
        table.add_column(col, justify="right")
    for sw in doc["switches"]:
        cells = [
            f"{fmt_ms(p['switch_s'])} / {fmt_ms(p['first_decision_s'])}" for p in sw["replicas"]
        ]
        table.add_row(
            str(sw["index"]),
            f"{sw['from']} -> {sw['to']}",
            fmt_ms(sw["alias_to_notice_s"]),
            *cells,
            fmt_ms(sw["switch_s"]),
            fmt_ms(sw["first_decision_s"]),
        )
    console.print(table)
    sm, it = doc["summary"], doc["integrity"]
    summary = Table(title="summary")
    summary.add_column("measure")
    summary.add_column("value", justify="right")
    rows = [
        ("switches done / requested", f"{sm['switched']} / {sm['switches']}"),
        ("switch time p50 (ms)", fmt_ms(sm["switch_s_p50"])),
        ("switch time max (ms)", fmt_ms(sm["switch_s_max"])),
        (f"switches <= {sm['target_s']:g} s", f"{sm['within_target']} / {sm['switches']}"),
        ("  alias write -> notice sent, p50 (ms)", fmt_ms(sm["alias_to_notice_s_p50"])),
        ("  notice received -> swapped, p50 (ms)", fmt_ms(sm["notice_to_swapped_s_p50"])),
        ("  of which loaded -> swapped, p50 (ms)", fmt_ms(sm["loaded_to_swapped_s_p50"])),
        (
            "loads via notice / poll / missed notice",
            " / ".join(str(sm["loads_via"][v]) for v in ("notice", "poll", "poll (notice missed)")),
        ),
        (
            "first new decision p50 / max (ms)",
            f"{fmt_ms(sm['first_decision_s_p50'])} / {fmt_ms(sm['first_decision_s_max'])}",
        ),
        ("decisions (distinct task attempts)", str(it["tasks_decided"])),
        ("decision records (incl. re-emits)", str(it["decision_records"])),
        ("tasks asked (task_ready)", str(it["tasks_asked"])),
        ("lost (asked, never decided)", str(it["lost"])),
        ("decided twice (different decisions)", str(it["decided_twice"])),
        ("identical re-emits", str(it["identical_reemits"])),
        ("decisions naming a wrong version", str(it["wrong_version"])),
        (
            "replays complete / incomplete / failed",
            f"{it['replays'] - it['replays_failed'] - it['replays_incomplete']}"
            f" / {it['replays_incomplete']} / {it['replays_failed']}",
        ),
        ("workflows replayed", str(it["workflows_replayed"])),
        ("wall (s)", f"{doc['wall_s']:.0f}"),
        (
            f"load average 1 min, start / end ({os.cpu_count()} cores)",
            f"{doc['setup']['load_avg_1m_start']:.1f} / {doc['setup']['load_avg_1m_end']:.1f}",
        ),
    ]
    for k, v in rows:
        summary.add_row(k, v)
    console.print(summary)


def main() -> None:
    """Parse the options, run the benchmark, print its tables and write its JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--switches", type=int, default=8)
    ap.add_argument("--daemons", type=int, default=2)
    ap.add_argument("--interval", type=float, default=2.5, help="seconds between alias moves")
    ap.add_argument("--workflows", type=int, default=12, help="workflows per replay")
    ap.add_argument("--redis-url", default=DEFAULT_REDIS)
    ap.add_argument(
        "--early-notice",
        action="store_true",
        help="experiment: also publish the Redis notice right after the alias write "
        "(promote publishes it only after the audit record)",
    )
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="experiment: OMP_NUM_THREADS for the replicas (default: torch's own choice)",
    )
    ap.add_argument("--keep-home", action="store_true", help="keep the temporary home and logs")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args()
    os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
    from dagsched.logging import configure_logging

    configure_logging("WARNING", json=False)
    doc = asyncio.run(run(args))
    show(doc)
    args.out.mkdir(parents=True, exist_ok=True)
    name = "switch_time"
    if args.early_notice:
        name += "_early_notice"
    if args.torch_threads is not None:
        name += f"_torch{args.torch_threads}"
    write_results(args.out / f"{name}.json", doc)


if __name__ == "__main__":
    main()
