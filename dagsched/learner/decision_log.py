"""The compact decision log: one cluster view per policy call plus a small record per task.

Logging each decision's whole observation would take ~10 KB of JSON (every node's
features, the DAG's, the anchors). Most of it is shared by the tasks of one policy call: the
cluster view they were placed on, changed only by the batch's earlier placements. So a
`DecisionBatchMsg` carries that view once (`encode_view`: the `ClusterView`'s arrays, raw
little-endian, zlib, base64) and per task where its workflow stood (`task_view_record`) and
its placement; `batch_observations` replays the call: per task in order, `observe` on the
view, then `ClusterView.take` of its placement, exactly as `GNNScheduler.place` does, which
gives back the observations the model saw, bit for bit, from the workflows (the learner has
them from `dagsched.tasks`, `dagsched explain` from Redis). About 40 bytes of view and 300 of
task record per decision at 32 nodes and a batch of 64, instead of ~10,000.

Both views are encoded field by field from their dataclasses, so a field added to either is
logged without a change here; `tests/learner/test_decision_log.py` checks the replay against
what the scheduler itself observed, and the daemon compares the first task of a call (every
call of a version's first few, then a sample: `daemon.call_log.snapshot`).

Here, in `learner`, because the daemon (writer), the learner and `dagsched explain`
(readers) all may import it, and it needs the observation code of `policy`.
"""

from __future__ import annotations

import base64
import json
import zlib
from collections.abc import Callable, Sequence
from dataclasses import astuple, dataclass, field, fields, replace
from typing import Any

import numpy as np

from dagsched.core.heft import heft_order
from dagsched.core.history import FamilySummary
from dagsched.core.observation import Observation, observe
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import Workflow
from dagsched.schemas.messages import DecisionBatchMsg, DecisionLogMsg, LoggedTaskMsg

_TASK_FIXED = ("workflow", "idx", "attempt")  # carried by the task record itself


class DecisionLogError(ValueError):
    """A decision-log record that cannot be decoded or replayed."""


# -- the cluster view -------------------------------------------------------------------------


def encode_view(view: ClusterView) -> str:
    """`view` as ASCII: a JSON header (scalars, lists, array dtypes and shapes) and the arrays'
    raw bytes, zlib-compressed, base64. Its running attempts are kept as what they tell a
    scheduler at the view's time: each node's first expected end."""
    if view.running is not None:
        view = replace(view, first_end_s=view.first_ends_s(), running=None)
    head: dict[str, Any] = {}
    blobs: list[bytes] = []
    for f in fields(ClusterView):
        x = getattr(view, f.name)
        if isinstance(x, np.ndarray):
            a = np.ascontiguousarray(x)
            head[f.name] = ["a", a.dtype.str, list(a.shape)]
            blobs.append(a.tobytes())
        else:
            head[f.name] = ["j", x]
    h = json.dumps(head, separators=(",", ":")).encode()
    raw = len(h).to_bytes(4, "little") + h + b"".join(blobs)
    return base64.b64encode(zlib.compress(raw, 1)).decode("ascii")


def decode_view(text: str) -> ClusterView:
    """Inverse of `encode_view` (DecisionLogError when it is not one of this code's views)."""
    try:
        raw = zlib.decompress(base64.b64decode(text, validate=True))
        n = int.from_bytes(raw[:4], "little")
        head = json.loads(raw[4 : 4 + n])
        pos = 4 + n
        kw: dict[str, Any] = {}
        for name, spec in head.items():
            if spec[0] == "a":
                dtype, shape = np.dtype(spec[1]), tuple(spec[2])
                size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
                kw[name] = np.frombuffer(raw, dtype, count=size // dtype.itemsize, offset=pos)
                kw[name] = kw[name].reshape(shape).copy()
                pos += size
            else:
                kw[name] = spec[1]
        return ClusterView(**kw)
    except (ValueError, TypeError, KeyError, IndexError, zlib.error) as exc:
        raise DecisionLogError(f"not a logged cluster view: {exc}") from None


# -- the task view ----------------------------------------------------------------------------


def task_view_record(tv: TaskView, memo: dict[int, Any] | None = None) -> dict[str, Any]:
    """`tv` without its workflow, as JSON-able values. Bool arrays (where the workflow
    stands) as a bitmap: hex of `np.packbits`, so a task of a 2,000-task map stage logs ~500
    characters, not its 2,000 siblings' indices. `memo`: encodings already made, by array id,
    for arrays a caller shares between tasks (the daemon's done and active masks are one
    array per workflow and round); the caller keeps those arrays alive while it is used."""
    out: dict[str, Any] = {}
    for f in fields(TaskView):
        if f.name in _TASK_FIXED:
            continue
        x = getattr(tv, f.name)
        if isinstance(x, np.ndarray):
            hit = memo.get(id(x)) if memo is not None else None
            if hit is None:
                hit = _array_record(x)
                if memo is not None:
                    memo[id(x)] = hit
            out[f.name] = hit
        elif isinstance(x, np.generic):
            out[f.name] = x.item()
        elif isinstance(x, FamilySummary):  # compact: its values in field order
            out[f.name] = {"family_summary": list(astuple(x))}
        else:
            out[f.name] = x
    return out


def _array_record(x: np.ndarray) -> dict[str, Any]:
    if x.dtype == bool:
        return {"bits": np.packbits(x).tobytes().hex(), "n": int(x.size)}
    return {"values": x.tolist(), "dtype": x.dtype.str}


def _bool_array(rec: dict[str, Any]) -> np.ndarray:
    """A bool array from its record: "bits" (now) or "true_at" (logs written before)."""
    n = int(rec["n"])
    if "bits" in rec:
        bits = np.unpackbits(np.frombuffer(bytes.fromhex(rec["bits"]), dtype=np.uint8))
        if bits.size < n or bits.size > n + 7:
            raise ValueError(f"{bits.size} bits for {n} entries")
        return bits[:n].astype(bool)
    a = np.zeros(n, dtype=bool)
    a[np.asarray(rec["true_at"], dtype=np.int64)] = True
    return a


def task_view_from(rec: LoggedTaskMsg, wf: Workflow) -> TaskView:
    """The `TaskView` a task record was made from, given its workflow."""
    kw: dict[str, Any] = {"workflow": wf, "idx": rec.task, "attempt": rec.attempt}
    try:
        for f in fields(TaskView):
            if f.name in _TASK_FIXED:
                continue
            x = rec.view[f.name]
            if isinstance(x, dict) and ("bits" in x or "true_at" in x):
                kw[f.name] = _bool_array(x)
            elif isinstance(x, dict) and "values" in x:
                kw[f.name] = np.asarray(x["values"], dtype=np.dtype(x["dtype"]))
            elif isinstance(x, dict) and "family_summary" in x:
                kw[f.name] = FamilySummary(*x["family_summary"])
            else:
                kw[f.name] = x
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DecisionLogError(f"task record {rec.task_key}: no {exc} in its view") from None
    if rec.task >= wf.size:
        raise DecisionLogError(f"task record {rec.task_key}: out of its workflow's range")
    return TaskView(**kw)


# -- the replay -------------------------------------------------------------------------------


def batch_observations(
    msg: DecisionBatchMsg, workflow: Callable[[str], Workflow | None]
) -> list[Observation | None]:
    """Per task of the batch, the observation the policy saw: in the order the model placed
    them (`core.heft.heft_order`), `observe` on the view with the earlier placements taken.
    All None when `workflow(id)` does not know one of the batch's workflows (the others may
    depend on its placement), and for a batch without a view (the fallback's)."""
    out: list[Observation | None] = [None] * len(msg.tasks)
    if msg.view is None:
        return out
    view = decode_view(msg.view).batch_copy()
    tvs: list[TaskView] = []
    for rec in msg.tasks:
        wf = workflow(rec.workflow_id)
        if wf is None:
            break
        if not 0 <= rec.node_index < view.n:
            raise DecisionLogError(f"task record {rec.task_key}: node {rec.node_index} unknown")
        tvs.append(task_view_from(rec, wf))
    if len(tvs) < len(msg.tasks):  # the placing order needs every task of the call
        return out
    for i in heft_order(tvs):  # the order the model placed them in
        rec = msg.tasks[i]
        out[i] = observe(view, tvs[i])
        view.take(tvs[i], rec.node_index, rec.cpu, rec.mem)
    return out


@dataclass
class LoggedDecision:
    """What the learner and `dagsched explain` read of one decision's log, from either form:
    a `decision_log` record (with its whole observation) or a task of a `decision_batch`
    (whose observation is replayed on demand, once per batch)."""

    workflow_id: str
    task: int
    attempt: int
    model_version: str
    arm: str
    decided_at: float
    node_index: int
    unit: list[float] | None
    log_prob: float
    value: float | None
    _legacy: DecisionLogMsg | None = None
    _batch: _Batch | None = None
    _position: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (f"{self.workflow_id}/{self.task}", self.attempt)

    @property
    def workflow_ids(self) -> set[str]:
        """The workflows its observation is replayed with (its batch's tasks')."""
        if self._batch is None:
            return {self.workflow_id}
        return {t.workflow_id for t in self._batch.msg.tasks}

    @property
    def has_observation(self) -> bool:
        """Whether an observation was logged (False for the fallback's decisions)."""
        if self._legacy is not None:
            return self._legacy.observation is not None
        return self._batch is not None and self._batch.msg.view is not None

    def observation(self, workflow: Callable[[str], Workflow | None]) -> Observation | None:
        """The observation the decision was made from (None when it cannot be had: no view
        logged, an unknown workflow, a record this code cannot read)."""
        from dagsched.core.observation import observation_from_dict

        if self._legacy is not None:
            if self._legacy.observation is None:
                return None
            try:
                return observation_from_dict(self._legacy.observation)
            except ValueError:
                return None
        if self._batch is None:
            return None
        try:
            return self._batch.observations(workflow)[self._position]
        except DecisionLogError:
            return None

    def as_message(self, workflow: Callable[[str], Workflow | None]) -> DecisionLogMsg:
        """The `decision_log` message of this decision (what `dagsched explain` reads)."""
        if self._legacy is not None:
            return self._legacy
        from dagsched.core.observation import observation_to_dict

        obs = self.observation(workflow)
        return DecisionLogMsg(
            workflow_id=self.workflow_id,
            task=self.task,
            attempt=self.attempt,
            model_version=self.model_version,
            arm=self.arm,  # type: ignore[arg-type]
            node_index=self.node_index,
            unit=self.unit,
            log_prob=self.log_prob,
            value=self.value,
            decided_at=self.decided_at,
            observation=observation_to_dict(obs) if obs is not None else None,
        )


@dataclass
class _Batch:
    msg: DecisionBatchMsg
    _obs: list[Observation | None] | None = field(default=None, repr=False)

    def observations(self, workflow: Callable[[str], Workflow | None]) -> list[Observation | None]:
        # replayed once; a replay cut short by an unknown workflow is tried again later
        if self._obs is None or (self._obs and self._obs[-1] is None and self.msg.view):
            self._obs = batch_observations(self.msg, workflow)
        return self._obs


def logged(msg: DecisionLogMsg | DecisionBatchMsg) -> list[LoggedDecision]:
    """The decisions a decision-log message holds: one for a `decision_log`, the `new` tasks
    of a `decision_batch`."""
    if isinstance(msg, DecisionLogMsg):
        return [
            LoggedDecision(
                msg.workflow_id, msg.task, msg.attempt, msg.model_version, msg.arm,
                msg.decided_at, msg.node_index, msg.unit, msg.log_prob, msg.value, _legacy=msg,
            )
        ]  # fmt: skip
    batch = _Batch(msg)
    return [
        LoggedDecision(
            t.workflow_id, t.task, t.attempt, msg.model_version, msg.arm, msg.decided_at,
            t.node_index, t.unit, t.log_prob, t.value, _batch=batch, _position=i,
        )
        for i, t in enumerate(msg.tasks)
        if t.new
    ]  # fmt: skip


def batch_message(
    *,
    model_version: str,
    arm: str,
    decided_at: float,
    view: str | None,
    tasks: Sequence[LoggedTaskMsg],
) -> DecisionBatchMsg:
    """A `decision_batch` (typed for the daemon's use)."""
    return DecisionBatchMsg(
        model_version=model_version,
        arm=arm,  # type: ignore[arg-type]
        decided_at=decided_at,
        view=view,
        tasks=list(tasks),
    )
