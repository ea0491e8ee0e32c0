"""The decision log of one policy call: the view it saw, once, and a small record per task.

`PolicyCall` collects what a call of the champion, challenger or fallback placed in a round;
once the round's reservations are answered, `record()` gives the `decision_batch` message of
the call (if any of its tasks is a new decision) and the keys of its new decisions. The
format and its replay are `dagsched.learner.decision_log`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import structlog

from dagsched.core.heft import heft_order
from dagsched.core.observation import Observation, observe
from dagsched.core.scheduler import Placement
from dagsched.core.view import ClusterView, TaskView
from dagsched.daemon import encoding
from dagsched.learner.decision_log import encode_view, task_view_record
from dagsched.schemas.messages import TaskReadyMsg

log = structlog.get_logger(__name__)

Trace = tuple[list[float], float] | None  # the model's unit action and value for one task
Logged = tuple[list[str], bytes]  # the keys "{wf}/{task}:{attempt}" of its new decisions, record

_unfaithful: set[str] = set()  # versions whose log stopped
_calls: dict[str, int] = {}  # per version, the calls snapshot was asked for


@dataclass
class PolicyCall:
    """One call of a policy in one round, in placing order."""

    arm: str
    version: str
    decided_at: float
    view: str | None  # the encoded view the policy was called on (None: not logged)
    tasks: list[tuple[TaskReadyMsg, TaskView, Placement, Trace]] = field(default_factory=list)
    new: list[bool] = field(default_factory=list)

    def add(self, m: TaskReadyMsg, tv: TaskView, p: Placement, trace: Trace) -> int:
        """Append a placed task; its position (to mark it new once Redis answered)."""
        self.tasks.append((m, tv, p, trace))
        self.new.append(False)
        return len(self.tasks) - 1

    def record(self) -> Logged | None:
        """The `decision_batch` of this call and its new decisions' keys (None: none new)."""
        if not any(self.new):
            return None
        model = self.view is not None
        tasks = []
        keys = []
        memo: dict[int, Any] = {}  # siblings share their workflow's masks: encoded once
        for (m, tv, p, trace), new in zip(self.tasks, self.new, strict=True):
            tasks.append(
                encoding.logged_task(
                    m.workflow_id,
                    m.task,
                    m.attempt,
                    new,
                    int(p.node),
                    _fraction(p.cpu),
                    _fraction(p.mem),
                    trace[0] if trace else None,
                    encoding.bounded_log_prob(p.log_prob),
                    trace[1] if trace and math.isfinite(trace[1]) else None,
                    task_view_record(tv, memo) if model else {},
                )
            )
            if new:
                keys.append(f"{m.workflow_id}/{m.task}:{m.attempt}")
        raw = encoding.decision_batch(self.version, self.arm, self.decided_at, self.view, tasks)
        return keys, raw


def _fraction(x: float) -> float:
    return float(x) if 0.0 <= x <= 1.0 else float(np.clip(np.nan_to_num(x), 0.0, 1.0))


# a version's first calls are all checked, then one in SAMPLE_EVERY: the check recomputes an
# observation (~0.5 ms, a tenth of a small batch's cost at 1,000 tasks/s)
FULL_CHECKS = 8
SAMPLE_EVERY = 16


def snapshot(sched: Any, view: ClusterView, tvs: list[TaskView], version: str) -> str | None:
    """The view a model was called on, encoded, when it replays faithfully: the first placed
    task's observation is recomputed from it and compared with what the scheduler observed (every
    call of a version's first `FULL_CHECKS`, then one in `SAMPLE_EVERY`). At a mismatch (the
    observation reads something the log does not capture) the version logs nothing more,
    rather than observations the model did not see."""
    seen: list[Observation] | None = getattr(sched, "last_observations", None)
    if not seen or len(seen) != len(tvs) or version in _unfaithful:
        return None
    calls = _calls[version] = _calls.get(version, 0) + 1
    checked = calls <= FULL_CHECKS or calls % SAMPLE_EVERY == 0
    first = heft_order(tvs)[0]  # the first task the model placed saw the view untouched
    if checked and not _same(observe(view, tvs[first]), seen[first]):
        _unfaithful.add(version)
        log.error("decision_log.unfaithful", version=version, calls=calls)
        return None
    return encode_view(view)


def _same(a: Observation, b: Observation) -> bool:
    return (
        a.task_idx == b.task_idx
        and np.array_equal(a.nodes, b.nodes)
        and np.array_equal(a.cluster, b.cluster)
        and np.array_equal(a.dag, b.dag)
        and np.array_equal(a.base, b.base)
        and np.array_equal(a.base_logits, b.base_logits)
        and np.array_equal(a.mask, b.mask)
        and np.array_equal(a.edges, b.edges)
    )
