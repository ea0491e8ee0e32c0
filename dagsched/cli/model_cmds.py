"""`dagsched models ...` and `dagsched eval`: inspect registry versions, evaluate a model."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from dagsched.cli.console import progress_bar, stderr_is_tty
from dagsched.cli.context import help_without_command, state

models_app = typer.Typer(
    help="Inspect policy versions in the MLflow registry.", no_args_is_help=False
)


@models_app.callback(invoke_without_command=True)
def _models(ctx: typer.Context) -> None:
    help_without_command(ctx)


def _registry(ctx: typer.Context) -> Any:
    from dagsched.registry.store import Registry

    reg = Registry(state(ctx).settings())
    reg.ensure_champion()
    return reg


@models_app.command("list")
def list_cmd(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="One JSON array on stdout."),
) -> None:
    """Versions with their aliases, metrics, tags and audit trail (the shipped champion if
    empty)."""
    from dagsched.registry.promotion import audit_trail

    reg = _registry(ctx)
    trail = audit_trail(reg)
    by_version: dict[str, list[str]] = {}
    for alias, v in reg.aliases().items():
        by_version.setdefault(v, []).append(alias)
    rows = []
    for mv in reg.versions():
        tags = dict(mv.tags)
        rows.append(
            {
                "version": str(mv.version),
                "aliases": sorted(by_version.get(str(mv.version), [])),
                "created": mv.creation_timestamp,
                "run_id": mv.run_id,
                "parent": tags.get("parent", ""),
                "data": tags.get("data", ""),
                "metrics": {k[7:]: v for k, v in tags.items() if k.startswith("metric.")},
                "tags": {
                    k: v
                    for k, v in tags.items()
                    if not k.startswith(("metric.", "sha256.", "audit."))
                    and k not in ("parent", "data")
                },
                "audit": [r for r in trail if str(mv.version) in (r["version"], r["from_version"])],
            }
        )
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table(title=f"registered model {reg.name}")
    for col in ("version", "aliases", "parent", "data", "metrics"):
        table.add_column(col)
    for r in rows:
        metrics = ", ".join(
            f"{k}={v}" for k, v in sorted(r["metrics"].items()) if k.startswith("eval/")
        )
        table.add_row(r["version"], ",".join(r["aliases"]), r["parent"], r["data"], metrics)
    Console().print(table)
    if trail:
        audit = Table(title="audit trail (oldest first)")
        for col in ("when", "action", "version", "from", "actor", "reason"):
            audit.add_column(col)
        for a in trail:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a["at"]))
            audit.add_row(
                when, a["action"], a["version"], a["from_version"], a["actor"], a["reason"]
            )
        Console().print(audit)


@models_app.command("show")
def show_cmd(
    ctx: typer.Context, version: str = typer.Argument(..., help="Version number.")
) -> None:
    """Every tag of one version (checksums, lineage, metrics) as JSON."""
    reg = _registry(ctx)
    from mlflow.exceptions import MlflowException

    try:
        mv = reg.client.get_model_version(reg.name, version)
    except MlflowException:
        raise typer.BadParameter(f"no version {version} of {reg.name}") from None
    from dagsched.registry.promotion import audit_trail

    aliases = [a for a, v in reg.aliases().items() if v == str(mv.version)]
    typer.echo(
        json.dumps(
            {
                "version": str(mv.version),
                "aliases": aliases,
                "run_id": mv.run_id,
                "source": mv.source,
                "tags": dict(mv.tags),
                "audit": audit_trail(reg, str(mv.version)),
            },
            indent=2,
        )
    )


def _actor() -> str:
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"operator:{user}@{socket.gethostname()}"


@models_app.command("promote")
def promote_cmd(
    ctx: typer.Context,
    version: str = typer.Argument(..., help="Version number to make the champion."),
    reason: str = typer.Option(..., "--reason", help="Why (stored in the audit trail)."),
) -> None:
    """Verify VERSION (checksums + smoke inference), then make it the champion; the old
    champion keeps the alias `previous`; daemons are notified on Redis."""
    from dagsched.registry.promotion import Promoter

    record = Promoter(_registry(ctx)).promote(version, reason, _actor())
    typer.echo(json.dumps(record))


@models_app.command("rollback")
def rollback_cmd(
    ctx: typer.Context,
    reason: str = typer.Option(..., "--reason", help="Why (stored in the audit trail)."),
) -> None:
    """Give the champion alias back to the `previous` version (verified first)."""
    from dagsched.registry.promotion import Promoter

    record = Promoter(_registry(ctx)).rollback(reason, _actor())
    typer.echo(json.dumps(record))


def _loads(text: str) -> list[float]:
    """`--loads`: comma-separated numbers in (0, 2]."""
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--loads: not a list of numbers: {text!r}") from None
    if not out or not all(0 < x <= 2 for x in out):
        raise typer.BadParameter(f"--loads: each load must be in (0, 2], got {text!r}")
    return out


def eval_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(
        None, "--model", help="Version, models:/NAME@alias, or bundle folder [default: champion]."
    ),
    policies: str | None = typer.Option(
        None,
        "--policies",
        help="Comma-separated policy names [default: the model, every baseline, mcts].",
    ),
    wfformat: Path | None = typer.Option(None, "--wfformat", help="WfFormat file or folder."),
    seeds: int = typer.Option(2, "--seeds", min=1, help="Held-out seeds per scenario."),
    workflows: int = typer.Option(40, "--workflows", min=1, help="Workflows per run."),
    mcts_budget: int = typer.Option(8, "--mcts-budget", min=1, help="Rollouts per decision."),
    mcts_workflows: int = typer.Option(
        8, "--mcts-workflows", min=1, help="Workflows per MCTS run (it is slow)."
    ),
    scenarios_only: str | None = typer.Option(
        None, "--scenarios", help="Comma-separated scenario names to keep."
    ),
    loads: str = typer.Option(
        "0.5,0.8,0.95", "--loads", help="Comma-separated loads, one `load:L` scenario each."
    ),
    out: Path = typer.Option(..., "--out", file_okay=False, help="Report folder."),
    as_json: bool = typer.Option(False, "--json", help="One JSON array of rows on stdout."),
) -> None:
    """Evaluate a model against every baseline and MCTS; write Markdown, CSV and PNG charts."""
    load_list = _loads(loads)  # bad flags fail before anything is imported or opened
    from dagsched.cli.eval_report import write_report
    from dagsched.cli.inputs import load_wfformat_path
    from dagsched.learner.offline_eval import evaluate, make_policies, scenarios
    from dagsched.registry.store import Registry
    from dagsched.registry.uri import load_model
    from dagsched.sim.runner import POLICY_NAMES

    settings = state(ctx).settings()
    name, sched = load_model(Registry(settings), model)
    names = (
        [p.strip() for p in policies.split(",") if p.strip()]
        if policies
        else [name, *POLICY_NAMES, "mcts"]
    )
    names = [name if p in ("champion", "model") else p for p in names]
    imported = load_wfformat_path(wfformat) if wfformat is not None else []
    cases = scenarios(settings.sim, workflows, imported, load_list)
    if scenarios_only:
        keep = {s.strip() for s in scenarios_only.split(",")}
        cases = [c for c in cases if c.name in keep]
        if not cases:
            raise typer.BadParameter(f"no scenario named {sorted(keep)}")
    try:
        factories = make_policies(names, sched, name, mcts_budget)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None
    with progress_bar("evaluations", enabled=stderr_is_tty() and not as_json) as bar:
        rows = evaluate(cases, factories, seeds, mcts_workflows=mcts_workflows, progress=bar)
    md = write_report(out, rows)
    typer.echo(json.dumps(rows) if as_json else md, nl=not as_json or True)


def _duration_s(text: str) -> float:
    """`--window`: `90m`, `2h`, `3600s` or seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    t = text.strip().lower()
    try:
        value = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise typer.BadParameter(f"--window: not a duration: {text!r} (e.g. 2h, 90m)") from None
    if value <= 0:
        raise typer.BadParameter(f"--window: must be > 0, got {text!r}")
    return value


def _compare_policy(ctx: typer.Context, ref: str) -> tuple[str, Any]:
    """A baseline by name, or a version / alias URI / bundle folder from the registry."""
    from functools import partial

    from dagsched.sim.runner import POLICY_NAMES, make_policy

    if ref in POLICY_NAMES:
        return ref, partial(make_policy, ref)  # picklable: replays may run in worker processes
    from dagsched.registry.errors import RegistryError
    from dagsched.registry.store import Registry
    from dagsched.registry.uri import load_model
    from dagsched.sim.snapshot import PolicyOf

    try:
        name, sched = load_model(Registry(state(ctx).settings()), ref)
    except (RegistryError, ValueError, OSError) as exc:
        raise typer.BadParameter(f"{ref}: {exc}") from None
    return name, PolicyOf(sched)


@models_app.command("compare")
def compare_cmd(
    ctx: typer.Context,
    a: str = typer.Argument(..., help="The serving version (or a baseline, e.g. heft_history)."),
    b: str = typer.Argument(..., help="The version or baseline judged against it."),
    window: str = typer.Option("2h", "--window", help="Arrivals to replay (e.g. 2h, 90m)."),
    replays: int | None = typer.Option(
        None, "--replays", min=1, help="K replays per version [evaluator.replay.replays]."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the simulated window."),
    recorded: bool = typer.Option(
        False,
        "--recorded",
        help="Replay the traffic recorded on the broker, not a simulated window.",
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    png: Path | None = typer.Option(None, "--png", dir_okay=False, help="Chart of the diffs."),
) -> None:
    """The replay judge for any two versions on a window of traffic: A serves a simulated
    window of the configured scenario (or, with --recorded, the windows of the traffic on
    the broker, served by whatever served it), then both replay it K times with common
    random numbers; per-replay differences (B - A) go through the paired test."""
    from dagsched.learner.replay_judge import ReplayJudge, config_from
    from dagsched.sim.replay_pool import replays_for

    span = _duration_s(window)
    if png is not None and not png.parent.is_dir():
        raise typer.BadParameter(f"--png: no folder {png.parent}")
    settings = state(ctx).settings()
    name_a, pol_a = _compare_policy(ctx, a)
    name_b, pol_b = _compare_policy(ctx, b)
    cfg = config_from(settings.evaluator.replay)
    if replays is not None:
        cfg = replace(cfg, replays=replays)
    if recorded:
        wins, source = _recorded_windows(settings, cfg, span, window)
    else:
        wins = _simulated_windows(settings, cfg, span, window, seed, pol_a)
        source = f"simulated window ({window}, seed {seed}, served by {name_a})"
    judge = ReplayJudge(cfg, settings.sim, replays=replays_for(cfg.workers))
    try:
        with progress_bar("windows", enabled=stderr_is_tty() and not as_json) as bar:
            for i, w in enumerate(wins):
                judge.judge(w, pol_a, pol_b)
                bar(i + 1, len(wins))
    finally:
        judge.replays.close()
    doc = _compare_doc(name_a, name_b, source, judge)
    if png is not None:
        _compare_png(doc, png)
    if as_json:
        typer.echo(json.dumps(doc))
        return
    _compare_table(doc)


def _simulated_windows(
    settings: Any, cfg: Any, span: float, window: str, seed: int, served: Any
) -> list[Any]:
    """The windows of `span` seconds of the configured scenario's arrivals, served by
    `served` in the simulator."""
    from dagsched.learner.replay_feed import record_run
    from dagsched.learner.replay_judge import TrafficRecorder
    from dagsched.sim.engine import Simulator
    from dagsched.sim.runner import stream_workflows

    sc = settings.sim
    wfs = []
    for wf in stream_workflows(sc, seed, 1_000_000):
        if wf.arrival_s > span:
            break
        wfs.append(wf)
    if not wfs:
        raise typer.BadParameter(f"--window {window}: no workflow arrives that soon")
    rec = TrafficRecorder.of(replace(cfg, window_workflows=min(cfg.window_workflows, len(wfs))))
    return record_run(
        lambda arrivals, hook: Simulator(sc, arrivals, seed=seed, on_outcome=hook),
        served(seed),
        rec,
        wfs,
    )


def _recorded_windows(settings: Any, cfg: Any, span: float, window: str) -> tuple[list[Any], str]:
    """The closed windows of the traffic recorded on the broker whose first workflow arrived
    within `span` seconds of the latest arrival, and a line saying what they are."""
    import asyncio
    import logging

    from aiokafka.errors import KafkaError

    from dagsched.learner.recorded import read_records, windows_of

    # aiokafka logs each failed connection at ERROR; the one-line error below says it instead
    kafka_log = logging.getLogger("aiokafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        records = asyncio.run(read_records(settings))
    except (KafkaError, OSError, TimeoutError) as exc:
        raise typer.BadParameter(
            f"--recorded: broker {settings.kafka_bootstrap} unreachable ({type(exc).__name__})"
        ) from None
    finally:
        kafka_log.setLevel(level)
    got = windows_of(settings, cfg, records, fit_window=True)
    if not got.windows:
        raise typer.BadParameter(
            f"--recorded: no window of up to {cfg.window_workflows} workflows has ended among the "
            f"{got.workflows} recorded on {settings.topic('tasks')}"
        )
    last = max(wf.arrival_s for w in got.windows for wf in w.workflows)
    wins = [w for w in got.windows if w.workflows[0].arrival_s >= last - span]
    wins = wins or got.windows[-1:]
    source = (
        f"recorded traffic: {len(wins)} of {len(got.windows)} closed windows ({window}), "
        f"{got.workflows} workflows on {settings.topic('tasks')}"
    )
    return wins, source


def _compare_doc(a: str, b: str, source: str, judge: Any) -> dict[str, Any]:
    from dataclasses import asdict

    from dagsched.reporting import to_jsonable

    reports = judge.reports
    v = judge.test.verdict()
    last = reports[-1] if reports else None
    return to_jsonable(
        {
            "a": a,
            "b": b,
            "source": source,
            "decision": last.decision if last is not None else "continue",
            "reason": last.reason if last is not None else "",
            "fidelity": asdict(last.fidelity) if last is not None else None,
            "stats": v.to_dict()["stats"],
            "rule": v.rule,
            "windows": [r.to_dict() for r in reports],
        }
    )


def _compare_table(doc: dict[str, Any]) -> None:
    console = Console()
    t = Table(title=f"{doc['b']} vs {doc['a']}: per-replay differences ({doc['source']})")
    for col in ("window", "replay", "JCT A (s)", "JCT B (s)", "JCT reduction", "SLA diff",
                "reward diff"):  # fmt: skip
        t.add_column(col, justify="right")
    for w in doc["windows"]:
        for k, d in enumerate(w["diffs"]):
            t.add_row(
                str(w["window"]),
                str(k),
                f"{w['champion'][k]['mean_jct_s']:.0f}",
                f"{w['challenger'][k]['mean_jct_s']:.0f}",
                f"{d['jct']:+.1%}",
                f"{d['sla']:+.3f}",
                f"{d['reward']:+.4f}",
            )
    console.print(t)
    s = Table(title=f"paired test: {doc['decision']} ({doc['reason']})")
    for col in ("metric", "mean diff", "95% confidence sequence"):
        s.add_column(col, justify="right")
    for m, st in doc["stats"].items():
        s.add_row(m, f"{st['diff']:+.4f}", f"[{st['lower']:+.4f}, {st['upper']:+.4f}]")
    console.print(s)
    f = doc["fidelity"]
    if f is not None:
        console.print(
            f"fidelity: replays of {doc['a']} predict mean JCT {f['predicted_jct_s']:.0f} s "
            f"against {f['observed_jct_s']:.0f} s observed ({_off(f['jct_err'])}), "
            f"SLA {f['predicted_sla']:.3f} against {f['observed_sla']:.3f}"
        )


def _off(err: float | None) -> str:
    return f"{err:.1%} off" if err is not None else "no workflow to compare"


def _compare_png(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    diffs = [d for w in doc["windows"] for d in w["diffs"]]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (m, label) in zip(
        axes, (("jct", "mean-JCT reduction"), ("sla", "SLA"), ("reward", "reward")), strict=True
    ):
        ys = [d[m] for d in diffs]
        ax.plot(range(1, len(ys) + 1), ys, "o", ms=4)
        st = doc["stats"][m]
        ax.axhspan(st["lower"], st["upper"], color="tab:blue", alpha=0.15, label="95% CS")
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xlabel("replay")
        ax.set_title(f"{doc['b']} - {doc['a']}: {label}")
    axes[0].legend()
    fig.suptitle(f"paired replays: {doc['decision']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
