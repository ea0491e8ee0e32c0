"""The wire contract: every message on a dagsched topic, as pydantic v2 models serialised to JSON.

Every message carries `schema_version` and a `type` that discriminates the union. Unknown
fields are errors, and every number is bounded, so a message that decodes is one the daemon
can act on. `decode` turns raw bytes into a message or raises `BadMessage` with one readable
line saying why (that line is what the dead-letter record carries). Before any parser runs it
checks the input's size and how deeply its JSON nests, so that no input, however large or deep,
can exhaust the decoder's memory or stack.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

SCHEMA_VERSION = 1

TaskTypeName = Literal["cpu", "io", "gpu", "mem"]
Arm = Literal["champion", "challenger", "explore", "fallback", "holdback"]
FailureReason = Literal["oom", "transient", "node_down", "cancelled"]

Id = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.:/#@+-]+$")]
Seconds = Annotated[float, Field(ge=0, le=1e9, allow_inf_nan=False)]
PosSeconds = Annotated[float, Field(gt=0, le=1e9, allow_inf_nan=False)]
Bytes = Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)]
Cores = Annotated[float, Field(gt=0, le=4096, allow_inf_nan=False)]
MemGb = Annotated[float, Field(gt=0, le=1e6, allow_inf_nan=False)]
Attempt = Annotated[int, Field(ge=0, le=1000)]
TaskIndex = Annotated[int, Field(ge=0, le=1_000_000)]


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)

    schema_version: Literal[1] = 1

    def encode(self) -> bytes:
        """The message as UTF-8 JSON bytes."""
        return self.model_dump_json().encode()


# -- dagsched.tasks -----------------------------------------------------------------------------


class TaskSpecMsg(BaseModel):
    """One task of a workflow: its type, demands at reference speed, data sizes, cold start."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=200)]
    type: TaskTypeName
    duration_s: PosSeconds
    cpu_cores: Cores
    mem_gb: MemGb
    input_bytes: Bytes = 0.0
    output_bytes: Bytes = 0.0
    cold_start_s: Seconds = 0.0
    # the recurring kind of task this is (history is kept per family); None: the task's name
    family: Annotated[str, Field(min_length=1, max_length=200)] | None = None


class WorkflowMsg(_Message):
    """A workflow DAG, published once before any of its tasks is ready. Key: workflow id.

    `edges` are (parent, child) positions in `tasks`; `deadline_s` is relative to `arrival_s`,
    which is on the job queue's clock (the same clock as event `at` times).
    """

    type: Literal["workflow"] = "workflow"
    workflow_id: Id
    tasks: Annotated[list[TaskSpecMsg], Field(min_length=1)]
    edges: list[tuple[TaskIndex, TaskIndex]] = Field(default_factory=list)
    deadline_s: PosSeconds
    arrival_s: Seconds = 0.0


class TaskReadyMsg(_Message):
    """Task `task` (position in its workflow) needs a placement for this `attempt`.

    A job queue that asks again for the same (workflow, task, attempt) gets the same decision.
    """

    type: Literal["task_ready"] = "task_ready"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt = 0
    # job-queue time the task became ready (the clock of dagsched.events); optional. The
    # daemon waits up to daemon.view_wait_ms for its cluster view to catch up with it.
    at: Seconds | None = None


# -- dagsched.decisions -------------------------------------------------------------------------


class DecisionMsg(_Message):
    """Where and how to run one task attempt, and which model (version, arm) decided it."""

    type: Literal["decision"] = "decision"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    node: Id
    cpu: Annotated[float, Field(ge=0.1, le=0.9)]
    mem: Annotated[float, Field(ge=0.2, le=0.8)]
    max_retries: Annotated[int, Field(ge=1, le=5)]
    # node queues drain by priority, higher first, then in the order tasks were queued
    priority: Annotated[float, Field(allow_inf_nan=False)] = 0.0
    model_version: Annotated[str, Field(min_length=1, max_length=200)]
    arm: Arm
    log_prob: Annotated[float, Field(le=0, allow_inf_nan=False)] = 0.0
    decided_at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    latency_ms: Annotated[float, Field(ge=0, allow_inf_nan=False)]

    @property
    def task_key(self) -> str:
        return f"{self.workflow_id}/{self.task}"


class DecisionLogMsg(_Message):
    """What a new decision was made from, for the learner and `dagsched explain`: the model's
    raw observation (None for the heuristic fallback) and its action in unit space."""

    type: Literal["decision_log"] = "decision_log"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    model_version: Annotated[str, Field(min_length=1, max_length=200)]
    arm: Arm
    node_index: Annotated[int, Field(ge=0)]
    unit: list[float] | None = None
    log_prob: Annotated[float, Field(le=0, allow_inf_nan=False)] = 0.0
    value: float | None = None
    decided_at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    observation: dict[str, Any] | None = None

    @property
    def task_key(self) -> str:
        return f"{self.workflow_id}/{self.task}"


Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class LoggedTaskMsg(BaseModel):
    """One task of a `decision_batch`, in the order the policy placed it: its placement as the
    policy returned it (node index into the batch's view, unclipped CPU and memory fractions),
    the model's unit action, log-prob and value, and `view`, where its workflow stood (the
    scheduler's `TaskView` without the workflow, field by field). `new` is False when this is
    not the task's decision (re-planned in a later round, or another replica decided it); its
    placement still shaped the observations of the tasks after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    new: bool
    node_index: Annotated[int, Field(ge=0)]
    cpu: Fraction
    mem: Fraction
    unit: list[float] | None = None
    log_prob: Annotated[float, Field(le=0, allow_inf_nan=False)] = 0.0
    value: Annotated[float, Field(allow_inf_nan=False)] | None = None
    view: dict[str, Any] = Field(default_factory=dict)

    @property
    def task_key(self) -> str:
        return f"{self.workflow_id}/{self.task}"


class DecisionBatchMsg(_Message):
    """What one policy call decided from, compactly (the decision log): the
    cluster view it was made on, once (`view`, encoded by `dagsched.learner.decision_log`;
    None for the heuristic fallback), and a small record per task. The observation of every
    task is rebuilt exactly from these and the workflows (`decision_log.batch_observations`),
    instead of ~10 KB of observation per decision. Key: none."""

    type: Literal["decision_batch"] = "decision_batch"
    model_version: Annotated[str, Field(min_length=1, max_length=200)]
    arm: Arm
    decided_at: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    view: str | None = None
    tasks: Annotated[list[LoggedTaskMsg], Field(min_length=1)]


# -- dagsched.events (key: node id) ---------------------------------------------------------


class TaskStartedMsg(_Message):
    """An attempt took its reservation on `node` at `at` (job-queue clock)."""

    type: Literal["task_started"] = "task_started"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    node: Id
    at: Seconds


class TaskFinishedMsg(_Message):
    """An attempt succeeded; `cpu_core_s`, `peak_mem_gb` and `runtime_s` are what it actually
    used and how long it computed: the only way anyone learns a task's real needs."""

    type: Literal["task_finished"] = "task_finished"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    node: Id
    at: Seconds
    cpu_core_s: Bytes = 0.0
    peak_mem_gb: Bytes = 0.0
    # measured: compute seconds (after inputs and cold start), and seconds waiting for inputs
    runtime_s: Seconds = 0.0
    transfer_s: Seconds = 0.0


class TaskFailedMsg(_Message):
    """An attempt failed (`reason`), with what it used until then. After an OOM kill,
    `peak_mem_gb` is the limit it hit: the real peak is only known to be above it."""

    type: Literal["task_failed"] = "task_failed"
    workflow_id: Id
    task: TaskIndex
    attempt: Attempt
    node: Id
    at: Seconds
    reason: FailureReason
    cpu_core_s: Bytes = 0.0
    peak_mem_gb: Bytes = 0.0
    # measured: compute seconds (after inputs and cold start), and seconds waiting for inputs
    runtime_s: Seconds = 0.0
    transfer_s: Seconds = 0.0


class NodeHeartbeatMsg(_Message):
    """A node is alive: its static shape and its current use (reported by the executor)."""

    type: Literal["node_heartbeat"] = "node_heartbeat"
    node: Id
    at: Seconds
    kind: Literal["cpu", "gpu", "io", "mem"]
    zone: Annotated[int, Field(ge=0, le=10_000)]
    cores: Cores
    mem_gb: MemGb
    gpu_mem_gb: Bytes = 0.0
    net_gbps: Annotated[float, Field(gt=0, le=1e5)] = 25.0
    used_cores: Bytes = 0.0
    used_mem_gb: Bytes = 0.0
    queue_len: Annotated[int, Field(ge=0, le=10_000_000)] = 0
    net_in_bytes: Bytes = 0.0
    failure_rate: Annotated[float, Field(ge=0, le=1e6)] = 0.0
    # measured: actual / advertised run time of the node's recent tasks (1 = as advertised)
    slowdown: Annotated[float, Field(gt=0, le=1e4)] = 1.0


class NodeDownMsg(_Message):
    """A node crashed: everything running or queued on it is gone."""

    type: Literal["node_down"] = "node_down"
    node: Id
    at: Seconds


class NodeUpMsg(_Message):
    """A node came back, empty."""

    type: Literal["node_up"] = "node_up"
    node: Id
    at: Seconds


# -- dagsched.deadletter ------------------------------------------------------------------------


class DeadLetterMsg(_Message):
    """An input the daemon rejected: the original bytes (base64), where it was, and why.

    Of an input over the size limit only the first `DEAD_LETTER_HEAD_BYTES` of its value and
    key are kept, and `original_size` gives the value's full size; the whole record stays on
    its topic at (`topic`, `partition`, `offset`) for as long as the broker retains it."""

    type: Literal["dead_letter"] = "dead_letter"
    original_b64: str
    key_b64: str | None = None
    topic: str
    partition: Annotated[int, Field(ge=0)]
    offset: Annotated[int, Field(ge=0)]
    reason: Annotated[str, Field(min_length=1)]
    at: float
    # set when `original_b64` holds only the head of a larger value
    original_size: Annotated[int, Field(ge=0)] | None = None

    @field_validator("original_b64", "key_b64")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            base64.b64decode(value, validate=True)
        return value

    @property
    def original(self) -> bytes:
        return base64.b64decode(self.original_b64)

    @classmethod
    def of(
        cls,
        raw: bytes | None,
        key: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        reason: str,
        at: float,
        *,
        whole: bool = True,
    ) -> DeadLetterMsg:
        """A dead-letter record for a rejected input; `whole=False` (an input over the size
        limit) keeps only the head of its value and key."""
        raw = raw or b""
        size = None
        if not whole:
            size = len(raw)
            raw = raw[:DEAD_LETTER_HEAD_BYTES]
            key = None if key is None else key[:DEAD_LETTER_HEAD_BYTES]
        return cls(
            original_b64=base64.b64encode(raw).decode(),
            key_b64=base64.b64encode(key).decode() if key is not None else None,
            topic=topic,
            partition=partition,
            offset=offset,
            reason=reason,
            at=at,
            original_size=size,
        )


TaskInput = WorkflowMsg | TaskReadyMsg
EventMsg = (
    TaskStartedMsg | TaskFinishedMsg | TaskFailedMsg | NodeHeartbeatMsg | NodeDownMsg | NodeUpMsg
)
TaskEvent = TaskStartedMsg | TaskFinishedMsg | TaskFailedMsg
Message = Annotated[
    WorkflowMsg
    | TaskReadyMsg
    | DecisionMsg
    | DecisionLogMsg
    | DecisionBatchMsg
    | TaskStartedMsg
    | TaskFinishedMsg
    | TaskFailedMsg
    | NodeHeartbeatMsg
    | NodeDownMsg
    | NodeUpMsg
    | DeadLetterMsg,
    Field(discriminator="type"),
]
MESSAGE_TYPES: dict[str, type[_Message]] = {
    m.model_fields["type"].default: m
    for m in (
        WorkflowMsg,
        TaskReadyMsg,
        DecisionMsg,
        DecisionLogMsg,
        DecisionBatchMsg,
        TaskStartedMsg,
        TaskFinishedMsg,
        TaskFailedMsg,
        NodeHeartbeatMsg,
        NodeDownMsg,
        NodeUpMsg,
        DeadLetterMsg,
    )
}

_ADAPTER: TypeAdapter[Any] = TypeAdapter(Message)
# what `decode` refuses by default: larger messages, and deeper JSON (this schema's messages
# nest 3 to 5 levels). The daemon's inputs have their own settings, `daemon.max_message_bytes`
# (tighter) and `daemon.max_message_depth`
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
MAX_MESSAGE_DEPTH = 32
DEAD_LETTER_HEAD_BYTES = 64 * 1024  # what a dead letter keeps of an input over the size limit

_UNIFORM = bytes.maketrans(b"{}", b"[]")  # depth only: an object nests as an array does
_NOT_BRACKETS = bytes(sorted(set(range(256)) - set(b"[]{}")))


class BadMessage(ValueError):
    """Input that is not a valid message; `reason` is one readable line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def nesting_depth(raw: bytes, limit: int = MAX_MESSAGE_DEPTH) -> int:
    """How deeply the arrays and objects of JSON text `raw` nest (0 for a scalar; brackets in
    strings do not count), counted up to `limit + 1` (any deeper text gives that). For text that
    is not JSON: at least as deep as a parser gets before it fails. No recursion, and no Python
    per character: bytes methods, and at most `limit + 1` passes over the brackets."""
    # escaped backslashes, then escaped quotes, go first (pairs, left to right, as a parser
    # reads them); every quote left opens or closes a string, so the even pieces between
    # quotes are outside strings (an unterminated string ends the text, as it ends a parse)
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"") if b"\\" in raw else raw
    brackets = b"".join(text.split(b'"')[::2]).translate(_UNIFORM, _NOT_BRACKETS)
    # each pass takes out the innermost pairs, one level of every nest; what no pass can take
    # (closers before openers: not JSON) bounds the depth with the openers left
    depth = 0
    while brackets and depth <= limit:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break
        brackets = inner
        depth += 1
    return min(limit + 1, depth + brackets.count(b"["))


def check_limits(
    raw: bytes, max_bytes: int = MAX_MESSAGE_BYTES, max_depth: int = MAX_MESSAGE_DEPTH
) -> None:
    """Raise `BadMessage` when `raw` is longer than `max_bytes` or its JSON nests deeper than
    `max_depth`: what a parser must never be handed."""
    if len(raw) > max_bytes:
        raise BadMessage(f"message of {len(raw)} bytes is over the size limit of {max_bytes} bytes")
    # the count of opening brackets bounds the depth: most messages never need the scan
    if raw.count(b"[") + raw.count(b"{") > max_depth and nesting_depth(raw, max_depth) > max_depth:
        raise BadMessage(f"JSON nested deeper than the limit of {max_depth} levels")


def decode(
    raw: bytes | None,
    *,
    max_bytes: int = MAX_MESSAGE_BYTES,
    max_depth: int = MAX_MESSAGE_DEPTH,
) -> Any:
    """Parse one message from `raw` JSON bytes; raise `BadMessage(reason)` when it is not one,
    including when it is over `max_bytes` or nests deeper than `max_depth` (`check_limits`).

    Typed as `Any` for callers that dispatch with `isinstance`; the value is always one of the
    `Message` models.
    """
    if raw is None:
        raise BadMessage("empty message (no value)")
    check_limits(raw, max_bytes, max_depth)
    try:
        return _parse(raw)
    except (RecursionError, MemoryError) as exc:  # within the limits, a last line of defence
        raise BadMessage(f"message too complex to decode ({type(exc).__name__})") from None


def _parse(raw: bytes) -> Any:
    try:
        data = json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise BadMessage("invalid JSON: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} column {exc.colno}"
        raise BadMessage(f"invalid JSON: {exc.msg} at {where}") from None
    except ValueError as exc:
        raise BadMessage(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise BadMessage(f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version is None:
        raise BadMessage("missing schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise BadMessage(f"unknown schema_version {version!r} (this build reads {SCHEMA_VERSION})")
    kind = data.get("type")
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        known = ", ".join(MESSAGE_TYPES)
        raise BadMessage(f"unknown message type {kind!r} (known: {known})")
    try:
        # strict: "3" is not a number and 1.5 is not an attempt (JSON mode still maps
        # arrays to the tuples of `edges`)
        return _ADAPTER.validate_json(raw, strict=True)
    except ValidationError as exc:
        raise BadMessage(describe_validation(exc, str(kind))) from None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number")


def describe_validation(exc: ValidationError, kind: str) -> str:
    """`task_ready.attempt: Input should be >= 0, got -1` (+ how many more errors)."""
    errors = exc.errors()
    first = errors[0]
    loc = [str(p) for p in first["loc"]]
    if loc and loc[0] == kind:  # the discriminator tag pydantic puts first
        loc = loc[1:]
    path = ".".join(loc) or "message"
    msg = first["msg"]
    value = first.get("input")
    if first["type"] not in ("missing", "extra_forbidden") and isinstance(
        value, str | int | float | bool
    ):
        shown = repr(value) if not isinstance(value, str) or len(value) < 60 else "a long string"
        msg = f"{msg}, got {shown}"
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{kind}.{path}: {msg}{more}"


def finite(x: float) -> float:
    """`x` if it is a finite float, else 0.0 (for numbers copied from simulations)."""
    return x if math.isfinite(x) else 0.0


def decode_fast(
    raw: bytes | None,
    fast: Sequence[tuple[bytes, type[BaseModel]]],
    max_bytes: int = MAX_MESSAGE_BYTES,
    max_depth: int = MAX_MESSAGE_DEPTH,
) -> Any:
    """`decode` within the limits, with a fast path for the common records: a record that
    starts with one of `fast`'s prefixes is validated straight into its model (pydantic's
    parser refuses deep nesting itself, without recursing in Python); one it refuses goes
    through `decode`'s checks."""
    if raw is not None and len(raw) <= max_bytes:
        for prefix, model in fast:
            if raw.startswith(prefix):
                try:
                    return model.model_validate_json(raw, strict=True)
                except ValidationError:
                    break
    return decode(raw, max_bytes=max_bytes, max_depth=max_depth)
