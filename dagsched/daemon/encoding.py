"""The daemon's own output messages as JSON bytes, without a pydantic model per decision.

`decision` and `decision_batch` give the bytes `DecisionMsg(...).encode()` and
`DecisionBatchMsg(...).encode()` give (same fields, same order, same numbers), about six times
faster: a batch of 64 spent more in building and validating those models than the heuristic
spent deciding it. The caller passes values already within the schema's bounds (the placer
clamps every number and `_check` refuses non-finite ones), which
`tests/daemon/test_encoding.py` checks against the models.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from dagsched.schemas.messages import SCHEMA_VERSION

_OPTS = orjson.OPT_SERIALIZE_NUMPY  # numpy scalars in a task's view record, as the model would


def bounded_log_prob(x: float) -> float:
    """A log-probability as the schema bounds it: at most 0, and 0 when not finite."""
    return min(0.0, float(x)) if math.isfinite(x) else 0.0


def decision(
    workflow_id: str,
    task: int,
    attempt: int,
    node: str,
    cpu: float,
    mem: float,
    max_retries: int,
    model_version: str,
    arm: str,
    log_prob: float,
    decided_at: float,
    latency_ms: float,
    priority: float = 0.0,
) -> bytes:
    """A `decision` message (`DecisionMsg`), encoded."""
    return orjson.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "type": "decision",
            "workflow_id": workflow_id,
            "task": task,
            "attempt": attempt,
            "node": node,
            "cpu": cpu,
            "mem": mem,
            "max_retries": max_retries,
            "priority": priority,
            "model_version": model_version,
            "arm": arm,
            "log_prob": log_prob,
            "decided_at": decided_at,
            "latency_ms": latency_ms,
        }
    )


def logged_task(
    workflow_id: str,
    task: int,
    attempt: int,
    new: bool,
    node_index: int,
    cpu: float,
    mem: float,
    unit: list[float] | None,
    log_prob: float,
    value: float | None,
    view: dict[str, Any],
) -> dict[str, Any]:
    """One task of a `decision_batch` (`LoggedTaskMsg`), as the dict `decision_batch` takes."""
    return {
        "workflow_id": workflow_id,
        "task": task,
        "attempt": attempt,
        "new": new,
        "node_index": node_index,
        "cpu": cpu,
        "mem": mem,
        "unit": unit,
        "log_prob": log_prob,
        "value": value,
        "view": view,
    }


def decision_batch(
    model_version: str,
    arm: str,
    decided_at: float,
    view: str | None,
    tasks: list[dict[str, Any]],
) -> bytes:
    """A `decision_batch` message (`DecisionBatchMsg`) of `logged_task` dicts, encoded."""
    return orjson.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "type": "decision_batch",
            "model_version": model_version,
            "arm": arm,
            "decided_at": decided_at,
            "view": view,
            "tasks": tasks,
        },
        option=_OPTS,
    )
