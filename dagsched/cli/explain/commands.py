"""`dagsched explain`: why the scheduler placed a task where it did.

Reads the decision and its decision log (observation, action) that the daemon stored in Redis,
reloads the model version that made it (registry, or `--model-dir` bundle), and attributes its
outputs to named features with Captum's Integrated Gradients (`dagsched.policy.attribution`).
Runs offline, on demand: never on the daemon's hot path.

This module holds the command and the one-decision flow (`--task-id`); its table is drawn by
`explain_table`, `--sample` runs in `explain_sample`, inputs come from `explain_sources`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from dagsched.cli.context import state
from dagsched.cli.explain.sample import explain_sample
from dagsched.cli.explain.sources import DecisionStore, ExplainFailed, Models, one_thread
from dagsched.cli.explain.table import print_table
from dagsched.core.bounds import UNIT_LOW, UNIT_SPAN
from dagsched.schemas.messages import DecisionLogMsg

if TYPE_CHECKING:
    from dagsched.policy.explanation import Explanation

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
        explain_sample(store, models, sample, out, as_json, top, steps)


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
    try:
        decision: dict[str, Any] | None = json.loads(raw_dec)
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

    from dagsched.cli.explain.charts import write_heatmap
    from dagsched.core.observation import observation_from_dict
    from dagsched.policy.attribution import explain_observation
    from dagsched.policy.explanation import CORE_TARGETS, ExplainError

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
            ex = explain_observation(
                sched.model,
                sched.normalizer,
                obs,
                log.node_index,
                targets=targets,
                n_steps=steps,
                node_ids=ids,
            )
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
        print_table(ex, top, png)


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
    if log.unit is not None and len(log.unit) == len(UNIT_LOW):
        logged = [float(UNIT_LOW[i] + log.unit[i] * UNIT_SPAN[i]) for i in range(len(UNIT_LOW))]
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
