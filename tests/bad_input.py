"""Hypothesis strategies of hostile input, shared by the decoding, daemon and CLI properties:
any bytes, any JSON, schema-valid but inconsistent messages, bad numbers, deep nesting and
Unicode ids. Each strategy draws the bytes a client could send; none knows the outcome."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# what JSON text a client may put where a number belongs: out of range, not finite (as the
# tokens some encoders write, or as overflowing literals), not a number, or too long to parse
BAD_NUMBERS: tuple[bytes, ...] = (
    b"NaN",
    b"Infinity",
    b"-Infinity",
    b"1e999",
    b"-1e999",
    b"-1",
    b"-1e308",
    b"1e308",
    b"1e30",
    b"100000000000000000000000000000",
    b"9" * 5000,
    b"-0.0",
    b"0",
    b"1.5",
    b"true",
    b'"3"',
    b"null",
    b"[]",
)

VALID_ID = st.from_regex(r"[A-Za-z0-9_.:/#@+-]{1,24}", fullmatch=True)
# any text at all, as an id: empty, long, outside ASCII, control characters
# lone surrogates (category Cs) cannot be written as UTF-8: no client can send them
_NO_SURROGATES = st.characters(blacklist_categories=("Cs",))
UNICODE_ID = st.text(alphabet=_NO_SURROGATES, min_size=0, max_size=40) | st.text(
    alphabet=st.characters(min_codepoint=0x80, blacklist_categories=("Cs",)),
    min_size=1,
    max_size=12,
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=25,
)


def depth(value: Any) -> int:
    """How deeply a decoded JSON value nests (0 for a scalar), as `nesting_depth` counts."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, list | dict):
            deepest = max(deepest, d)
            stack += [(x, d + 1) for x in (v.values() if isinstance(v, dict) else v)]
    return deepest


@st.composite
def deep_nesting(draw: st.DrawFn, at_least: int = 33) -> bytes:
    """Arrays and objects nested `at_least` to 100,000 levels, closed or not, maybe inside a
    message's field."""
    n = draw(st.integers(at_least, 100_000))
    opener, closer = draw(st.sampled_from([(b"[", b"]"), (b'{"a":', b"}"), (b'[{"k":', b"}]")]))
    closed = draw(st.booleans())
    body = opener * n + b"1" + (closer * n if closed else b"")
    if draw(st.booleans()):
        return b'{"schema_version":1,"type":"task_ready","workflow_id":"w","task":' + body + b"}"
    return body


def task_spec(name: str = "t", cores: float = 1.0) -> dict[str, Any]:
    """One valid task of a `workflow` message, as JSON data."""
    return {"name": name, "type": "cpu", "duration_s": 5.0, "cpu_cores": cores, "mem_gb": 1.0}


def workflow(wf_id: str, n: int, edges: list[tuple[int, int]] | None = None) -> dict[str, Any]:
    """A `workflow` message of `n` tasks as JSON data (a chain unless `edges` is given)."""
    return {
        "schema_version": 1,
        "type": "workflow",
        "workflow_id": wf_id,
        "tasks": [task_spec(f"t{i}") for i in range(n)],
        "edges": [
            list(e) for e in (edges if edges is not None else ((i, i + 1) for i in range(n - 1)))
        ],
        "deadline_s": 100.0,
    }


def task_ready(wf_id: str, task: int, attempt: int = 0) -> dict[str, Any]:
    """A `task_ready` message as JSON data."""
    return {
        "schema_version": 1,
        "type": "task_ready",
        "workflow_id": wf_id,
        "task": task,
        "attempt": attempt,
    }


def encode(doc: Any) -> bytes:
    """`doc` as compact JSON bytes, non-ASCII text kept as UTF-8."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode()


EVENTS: dict[str, dict[str, Any]] = {
    "task_started": {"workflow_id": "w", "task": 0, "attempt": 0, "node": "n1", "at": 1.0},
    "task_finished": {
        "workflow_id": "w", "task": 0, "attempt": 0, "node": "n1", "at": 2.0,
        "cpu_core_s": 1.0, "peak_mem_gb": 0.5, "runtime_s": 1.0,
    },
    "task_failed": {
        "workflow_id": "w", "task": 0, "attempt": 0, "node": "n1", "at": 2.0, "reason": "oom",
    },
    "node_heartbeat": {
        "node": "n1", "at": 0.0, "kind": "cpu", "zone": 0, "cores": 16.0, "mem_gb": 64.0,
        "queue_len": 0, "slowdown": 1.0,
    },
    "node_down": {"node": "n1", "at": 3.0},
    "node_up": {"node": "n1", "at": 4.0},
}  # fmt: skip


def valid_message_docs() -> st.SearchStrategy[dict[str, Any]]:
    """Messages a client sends (tasks and events topics), valid, as JSON data."""
    wf = st.builds(lambda i, n: workflow(i, n), VALID_ID, st.integers(1, 6))
    ready = st.builds(task_ready, VALID_ID, st.integers(0, 10), st.integers(0, 3))
    event = st.sampled_from(sorted(EVENTS)).map(
        lambda t: {"schema_version": 1, "type": t, **EVENTS[t]}
    )
    return wf | ready | event


def number_paths(doc: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Where `doc` holds a number (bools aside)."""
    if isinstance(doc, dict):
        return [p for k, v in doc.items() for p in number_paths(v, (*path, k))]
    if isinstance(doc, list):
        return [p for i, v in enumerate(doc) for p in number_paths(v, (*path, i))]
    if isinstance(doc, int | float) and not isinstance(doc, bool):
        return [path]
    return []


_HOLE = "\u0000hole\u0000"


def with_raw(doc: Any, path: tuple[Any, ...], token: bytes) -> bytes:
    """`doc` encoded with the value at `path` replaced by the raw JSON text `token`."""
    if not path:
        return token
    copy = json.loads(json.dumps(doc))
    at = copy
    for part in path[:-1]:
        at = at[part]
    at[path[-1]] = _HOLE
    return encode(copy).replace(encode(_HOLE), token)


@st.composite
def bad_number_messages(draw: st.DrawFn) -> bytes:
    """A valid message with one of its numbers replaced by a `BAD_NUMBERS` token."""
    doc = draw(valid_message_docs())
    paths = number_paths(doc)
    path = draw(st.sampled_from(paths))
    return with_raw(doc, path, draw(st.sampled_from(BAD_NUMBERS)))


@st.composite
def unicode_id_messages(draw: st.DrawFn) -> bytes:
    """A valid message whose workflow or node id is any text."""
    doc = draw(valid_message_docs())
    key = "workflow_id" if "workflow_id" in doc else "node"
    return encode({**doc, key: draw(UNICODE_ID)})


@st.composite
def mangled_messages(draw: st.DrawFn) -> bytes:
    """A valid message with a field dropped, added, or given any JSON value, or its text cut."""
    doc = draw(valid_message_docs())
    how = draw(st.sampled_from(["drop", "add", "replace", "cut", "type"]))
    keys = sorted(doc)
    if how == "drop":
        doc.pop(draw(st.sampled_from(keys)))
    elif how == "add":
        doc[draw(st.text(max_size=10))] = draw(json_values)
    elif how == "replace":
        doc[draw(st.sampled_from(keys))] = draw(json_values)
    elif how == "type":
        doc["type"] = draw(
            st.sampled_from(["workflow", "task_ready", "decision", "dead_letter", "x"])
        )
    raw = encode(doc)
    if how == "cut":
        raw = raw[: draw(st.integers(0, len(raw) - 1))]
    return raw


def any_input() -> st.SearchStrategy[bytes]:
    """Whatever a client may produce to an input topic."""
    return st.one_of(
        st.binary(max_size=200),
        json_values.map(encode),
        valid_message_docs().map(encode),
        bad_number_messages(),
        unicode_id_messages(),
        mangled_messages(),
        deep_nesting(),
    )


# the bounds of every number a `workflow` accepts: valid, and as extreme as valid gets
EXTREME_TASK: dict[str, tuple[float, ...]] = {
    "duration_s": (5e-324, 1e-9, 1e9),
    "cpu_cores": (5e-324, 1e-6, 4096.0),
    "mem_gb": (5e-324, 1e-6, 1e6),
    "input_bytes": (0.0, 1e15),
    "output_bytes": (0.0, 1e15),
    "cold_start_s": (0.0, 1e9),
}


@st.composite
def inconsistent_records(draw: st.DrawFn, wf_id: st.SearchStrategy[str] = VALID_ID) -> list[bytes]:
    """Schema-valid records that do not fit together or push every bound: a task of an unknown
    workflow or out of range, a cycle, a self-loop, a dangling edge, duplicate workflow ids,
    task names and edges, extreme numbers. Each comes with the task_ready that exercises it."""
    i = draw(wf_id)
    n = draw(st.integers(1, 5))
    kind = draw(
        st.sampled_from(
            ["unknown", "out_of_range", "cycle", "self_loop", "dangling", "dup_id", "dup_names",
             "dup_edges", "extreme", "deadline"]
        )
    )  # fmt: skip
    wf = workflow(i, n)
    ready = task_ready(i, draw(st.integers(0, n - 1)), draw(st.integers(0, 1000)))
    if kind == "unknown":
        return [encode(ready)]
    if kind == "out_of_range":
        return [encode(wf), encode(task_ready(i, n + draw(st.integers(0, 1_000_000 - n))))]
    if kind == "cycle":
        m = max(n, 2)
        ring = [(k, (k + 1) % m) for k in range(m)]
        return [encode(workflow(i, m, ring)), encode(task_ready(i, 0))]
    if kind == "self_loop":
        return [encode(workflow(i, n, [(0, 0)])), encode(ready)]
    if kind == "dangling":
        return [encode(workflow(i, n, [(0, n + draw(st.integers(0, 5)))])), encode(ready)]
    if kind == "dup_id":
        other = workflow(i, draw(st.integers(1, 5)))
        return [encode(wf), encode(other), encode(ready)]
    if kind == "dup_names":
        wf["tasks"] = [task_spec("same") for _ in range(n)]
        return [encode(wf), encode(ready)]
    if kind == "dup_edges":
        wf["edges"] = wf["edges"] * 3
        return [encode(wf), encode(ready)]
    if kind == "deadline":
        wf["deadline_s"] = draw(st.sampled_from([5e-324, 1e-9, 1e9]))
        wf["arrival_s"] = draw(st.sampled_from([0.0, 1e9]))
        return [encode(wf), encode(ready)]
    for t in wf["tasks"]:
        for field, values in EXTREME_TASK.items():
            t[field] = draw(st.sampled_from(values))
    return [encode(wf), encode(ready)]
