"""`dagsched explain`: why the scheduler placed a task where it did.

Reads the decision and its decision log (observation, action) that the daemon stored in Redis,
reloads the model version that made it (registry, or `--model-dir` bundle), and attributes its
outputs to named features with Captum's Integrated Gradients (`dagsched.policy.explain`).
Runs offline, on demand: never on the daemon's hot path.
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dagsched.cli.console import progress_bar, stderr_is_tty
from dagsched.cli.explain_report import SUMMARY_TARGETS, write_report
from dagsched.cli.explain_sources import DecisionStore, ExplainFailed, Models
from dagsched.cli.state import state
from dagsched.registry.errors import RegistryError
from dagsched.schemas.messages import DecisionLogMsg

if TYPE_CHECKING:
    from dagsched.policy.explain import Explanation
    from dagsched.policy.scheduler import GNNScheduler

TASK_ID_HELP = (
    "The task to explain, as WORKFLOW_ID/TASK_INDEX (the decision's workflow_id and task "
    "index, e.g. wf-17/3)."
)


# -- the command -----------------------------------------------------------------------------------


def explain_cmd(
    ctx: typer.Context,
    task_id: str | None = typer.Option(None, "--task-id", help=TASK_ID_HELP),
    attempt: int | None = typer.Option(
        None, "--attempt", min=0, help="Attempt number (default: the latest stored attempt)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    png: Path | None = typer.Option(
        None, "--png", help="Also write a heatmap of contributions over nodes x features."
    ),
    top: int = typer.Option(12, "--top", min=1, help="Rows per table."),
    sample: int | None = typer.Option(
        None, "--sample", min=1, help="Summarise the N most recent decisions (needs --out)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Folder for the --sample report (explain.md, charts, explain.json)."
    ),
    model_dir: Path | None = typer.Option(
        None,
        "--model-dir",
        help="Load models from this bundle folder (or a folder of bundles named by version) "
        "instead of the registry.",
    ),
    steps: int = typer.Option(
        32, "--steps", min=4, max=512, help="Integrated-gradients steps (Gauss-Legendre)."
    ),
    redis_url: str | None = typer.Option(
        None, "--redis-url", help="Redis URL (env DAGSCHED_REDIS_URL)."
    ),
) -> None:
    """Explain a decision: which features made the model pick this node and these values.

    Either --task-id WORKFLOW_ID/TASK_INDEX [--attempt K] for one decision (a table, --json,
    --png), or --sample N --out DIR for a Markdown report over the N most recent decisions per
    model version. Attributions: Captum Integrated Gradients from the training-mean
    observation; every target's contributions sum to its change from that baseline.
    """
    if (task_id is None) == (sample is None):
        raise typer.BadParameter("give either --task-id or --sample N (with --out DIR)")
    if sample is not None and out is None:
        raise typer.BadParameter("--sample needs --out DIR", param_hint="'--out'")
    if model_dir is not None and not model_dir.is_dir():
        raise typer.BadParameter(f"{model_dir} is not a folder", param_hint="'--model-dir'")
    flags = {"redis_url": redis_url} if redis_url is not None else {}
    settings = state(ctx).settings(flags)
    store = DecisionStore(settings)
    models = Models(settings, model_dir)
    if task_id is not None:
        _explain_one(store, models, task_id, attempt, as_json, png, top, steps)
    else:
        assert sample is not None and out is not None
        _explain_sample(store, models, sample, out, as_json, top, steps)


@contextmanager
def one_thread() -> Iterator[None]:
    """One torch intra-op thread while explaining: the batches are small, and on a shared
    2-core machine one thread measured 2-5x faster than two (bench/explain_speed.py); it also
    leaves the other cores to a daemon on the same host."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def parse_task_id(task_id: str) -> str:
    """Check a "WORKFLOW_ID/TASK_INDEX" task id; return it normalised."""
    wf, sep, idx = task_id.rpartition("/")
    if not sep or not wf or not idx.isdigit():
        raise typer.BadParameter(
            f"{task_id!r} is not WORKFLOW_ID/TASK_INDEX (e.g. wf-17/3)", param_hint="'--task-id'"
        )
    return f"{wf}/{int(idx)}"


def _load_log(raw: bytes, what: str) -> DecisionLogMsg:
    try:
        return DecisionLogMsg.model_validate_json(raw)
    except ValueError as exc:
        first = str(exc).splitlines()[0]
        raise ExplainFailed(f"stored decision log of {what} is malformed: {first}") from None


def _explain_one(
    store: DecisionStore,
    models: Models,
    task_id: str,
    attempt: int | None,
    as_json: bool,
    png: Path | None,
    top: int,
    steps: int,
) -> None:
    task_key = parse_task_id(task_id)
    k, raw_log, raw_dec = store.find(task_key, attempt)
    what = f"{task_key} attempt {k}"
    decision: dict[str, Any] | None = None
    if raw_dec is not None:
        try:
            decision = json.loads(raw_dec)
        except ValueError:
            decision = None
    if raw_log is None:
        arm = (decision or {}).get("arm")
        if arm == "fallback":
            _say_fallback(what, task_key, k, decision, None, as_json, png)
            return
        raise ExplainFailed(
            f"{what} was decided, but its decision log (observation) is not stored any more "
            "(expired, or written before decision logs existed)"
        )
    log = _load_log(raw_log, what)
    if log.arm == "fallback" or log.observation is None:
        _say_fallback(what, task_key, k, decision, log, as_json, png)
        return

    from dagsched.cli.explain_charts import write_heatmap
    from dagsched.policy.explain import CORE_TARGETS, ExplainError
    from dagsched.policy.features import observation_from_dict

    try:
        obs = observation_from_dict(log.observation)
    except ValueError as exc:
        raise ExplainFailed(f"{what}: {exc}") from None
    ids = _node_ids(store, obs.nodes.shape[0], log.node_index, decision)
    targets = (*CORE_TARGETS, "node_scores") if png is not None else CORE_TARGETS
    with one_thread():
        sched = models.get(log.model_version)
        t0 = time.perf_counter()
        try:
            ex = _explain(sched, obs, log.node_index, targets, steps, ids)
        except ExplainError as exc:
            raise ExplainFailed(f"{what}: {exc}") from None
    ex.meta = {
        "task_id": task_key,
        "attempt": k,
        "model_version": log.model_version,
        "arm": log.arm,
        "decided_at": log.decided_at,
        "decision": decision,
        "reproduces_log": _reproduces(ex, log),
        "explain_s": round(time.perf_counter() - t0, 4),
    }
    if png is not None:
        title = f"{task_key} attempt {k}: model {log.model_version} ({log.arm})"
        write_heatmap(png, ex, title)
    if as_json:
        d = ex.to_dict(top)
        if png is not None:
            d["png"] = str(png)
        typer.echo(json.dumps(d))
    else:
        _print_table(ex, top, png)


def _explain(
    sched: GNNScheduler,
    obs: Any,
    chosen: int,
    targets: Sequence[str],
    steps: int,
    ids: list[str] | None,
) -> Explanation:
    from dagsched.policy.explain import explain_observation

    return explain_observation(
        sched.model, sched.normalizer, obs, chosen, targets=targets, n_steps=steps, node_ids=ids
    )


def _node_ids(
    store: DecisionStore, n: int, chosen: int, decision: dict[str, Any] | None
) -> list[str] | None:
    """Node ids for display: Redis' current node set when it still lines up with the
    observation (same count, and the chosen index is the decision's node); else None."""
    if not 0 <= chosen < n:
        return None  # explain_observation refuses it with a clear error
    ids = store.node_ids()
    node = (decision or {}).get("node")
    if len(ids) == n and (node is None or ids[chosen] == node):
        return ids
    if node is not None:  # only the chosen node's id is known for sure
        return [node if i == chosen else f"node {i}" for i in range(n)]
    return None


def _reproduces(ex: Explanation, log: DecisionLogMsg) -> dict[str, Any]:
    """Does the reloaded model make the logged decision again (node and Beta means)?"""
    same_node = ex.recomputed_choice == log.node_index
    out: dict[str, Any] = {"node": same_node}
    if log.unit is not None and len(log.unit) == 3:
        lo, hi = (0.1, 0.2, 1.0), (0.9, 0.8, 5.0)
        logged = [lo[i] + log.unit[i] * (hi[i] - lo[i]) for i in range(3)]
        diff = max(abs(a - float(b)) for a, b in zip(logged, ex.values, strict=True))
        out["values"] = diff <= 1e-3 * 4  # retries span 4 units; 1e-3 of each range
        out["max_value_diff"] = float(f"{diff:.3g}")
    return out


def _say_fallback(
    what: str,
    task_key: str,
    attempt: int,
    decision: dict[str, Any] | None,
    log: DecisionLogMsg | None,
    as_json: bool,
    png: Path | None,
) -> None:
    node = (decision or {}).get("node")
    version = log.model_version if log is not None else (decision or {}).get("model_version")
    where = f" on {node}" if node else ""
    msg = (
        f"{what} was placed{where} by the heuristic fallback ({version}), not by a model: "
        "there are no model attributions to show"
    )
    if png is not None:
        msg += "; no picture written"
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "task_id": task_key,
                    "attempt": attempt,
                    "arm": "fallback",
                    "model_version": version,
                    "fallback": True,
                    "decision": decision,
                    "message": msg,
                    "targets": None,
                }
            )
        )
    else:
        typer.echo(msg)


# -- terminal output -------------------------------------------------------------------------------


def _console() -> Any:
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else 120)


def _fmt(x: float) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000 or abs(x) < 1e-3:
        return f"{x:.3g}"
    return f"{x:.4f}".rstrip("0").rstrip(".")


def _signed(x: float) -> str:
    return ("+" if x > 0 else "") + _fmt(x)


def _print_table(ex: Explanation, top: int, png: Path | None) -> None:
    from rich.table import Table

    from dagsched.policy.explain import BASELINE, METHOD, TARGETS

    con = _console()
    m = ex.meta
    probs = ex.probabilities
    c, r = ex.chosen, ex.runner_up
    vals = ex.values
    con.print(
        f"[bold]{m['task_id']} attempt {m['attempt']}[/]: model {m['model_version']} "
        f"({m['arm']}) placed it on [bold]{ex.node_name(c)}[/] (index {c}, p={probs[c]:.2f}), "
        f"cpu {vals[0]:.2f}, mem {vals[1]:.2f}, retries {vals[2]:.2f} (Beta means)"
    )
    if r is not None:
        con.print(
            f"runner-up: {ex.node_name(r)} (index {r}, p={probs[r]:.2f}); "
            f"logit gap {ex.logits[c] - ex.logits[r]:.4f}"
        )
    rep = m.get("reproduces_log", {})
    if not rep.get("node", True) or not rep.get("values", True):
        con.print(
            f"[yellow]warning[/]: this model now picks {ex.node_name(ex.recomputed_choice)} "
            "or other values than the log says: its files are not the ones that decided"
        )
    con.print(f"method: {METHOD}, {ex.n_steps} steps; baseline: {BASELINE}")

    table = Table(title=f"Top contributions to the {TARGETS['logit_chosen'][0]}")
    for col, just in (
        ("feature", "left"),
        ("belongs to", "left"),
        ("value", "right"),
        ("contribution", "right"),
    ):
        table.add_column(col, justify=just)  # type: ignore[arg-type]
    for x in ex.top("logit_chosen", top):
        table.add_row(x.feature, x.entity, _fmt(x.value), _signed(x.contribution))
    con.print(table)

    if r is not None:
        sep = Table(
            title=f"What separated {ex.node_name(c)} from {ex.node_name(r)} "
            f"(contributions to the logit gap)"
        )
        for col in ("feature", ex.node_name(c), ex.node_name(r), "contribution"):
            sep.add_column(col, justify="left" if col == "feature" else "right")
        for row in ex.separation(top):
            sep.add_row(
                row["feature"],
                _fmt(row["chosen_value"]),
                _fmt(row["runner_up_value"]),
                _signed(row["contribution"]),
            )
        sep.add_row("(cluster + DAG features, shared)", "", "", _signed(ex.shared_gap()))
        con.print(sep)

    cont = Table(title="Continuous values at the chosen node: top contributions")
    for col in ("value", "decided", "baseline", "top features (contribution)"):
        cont.add_column(
            col, justify="left" if col in ("value", "top features (contribution)") else "right"
        )
    for name in ("cpu", "mem", "max_retries"):
        t = ex.targets[name]
        tops = ", ".join(
            f"{x.feature} @ {x.entity} {_signed(x.contribution)}" for x in ex.top(name, 3)
        )
        cont.add_row(name, _fmt(t.output), _fmt(t.baseline_output), tops)
    con.print(cont)
    status = "ok" if ex.complete else "[red]FAILED[/]"
    con.print(
        "completeness: contributions sum to f(x) - f(baseline) for every target within "
        f"max(0.01, 1% of the change): {status} (largest error {ex.max_error:.2g})"
    )
    if png is not None:
        con.print(f"wrote {png}")


# -- --sample: a report over recent decisions ------------------------------------------------------


def _explain_sample(
    store: DecisionStore,
    models: Models,
    n: int,
    out: Path,
    as_json: bool,
    top: int,
    steps: int,
) -> None:
    from dagsched.policy.explain import CORE_TARGETS, ExplainError
    from dagsched.policy.features import observation_from_dict

    logs, stored, unreadable = store.recent_logs(n)
    by_version: dict[str, list[DecisionLogMsg]] = defaultdict(list)
    fallback = 0
    for log in logs:
        if log.arm == "fallback" or log.observation is None:
            fallback += 1
        else:
            by_version[log.model_version].append(log)
    sums: dict[str, dict[str, dict[str, float]]] = {}
    counts: dict[str, int] = {}
    arms: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    incomplete: dict[str, int] = {}
    max_err: dict[str, float] = {}
    total = sum(len(v) for v in by_version.values())
    done = 0
    with one_thread(), progress_bar("explaining", enabled=stderr_is_tty()) as progress:
        for version, items in by_version.items():
            try:
                sched = models.get(version)
            except RegistryError as exc:
                errors[version] = " ".join(str(exc).split())
                done += len(items)
                continue
            acc: dict[str, dict[str, float]] = {t: defaultdict(float) for t in SUMMARY_TARGETS}
            arms[version] = defaultdict(int)
            for log in items:
                done += 1
                progress(done, total)
                assert log.observation is not None
                try:
                    obs = observation_from_dict(log.observation)
                    ex = _explain(sched, obs, log.node_index, CORE_TARGETS, steps, None)
                except (ValueError, ExplainError):
                    unreadable += 1
                    continue
                counts[version] = counts.get(version, 0) + 1
                arms[version][log.arm] += 1
                if not ex.complete:
                    incomplete[version] = incomplete.get(version, 0) + 1
                max_err[version] = max(max_err.get(version, 0.0), ex.max_error)
                for t in SUMMARY_TARGETS:
                    if t in ex.targets:
                        for name, v in ex.per_feature(t).items():
                            acc[t][name] += v
            if counts.get(version):
                sums[version] = {
                    t: {k: v / counts[version] for k, v in acc[t].items()} for t in SUMMARY_TARGETS
                }
    out.mkdir(parents=True, exist_ok=True)
    report = write_report(
        out,
        n,
        stored,
        logs,
        fallback,
        unreadable,
        sums,
        counts,
        arms,
        errors,
        incomplete,
        max_err,
        models.source,
        top,
    )
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(
            f"wrote {out / 'explain.md'}: {len(logs)} decisions, "
            f"{sum(counts.values())} explained over {len(sums)} model version(s), "
            f"{fallback} by the heuristic fallback"
        )
