"""Properties of decoding every input topic's records, over generated hostile input: each
record becomes a message the daemon can act on, or `BadMessage` with a one-line reason; no
input raises anything else, however deep, large or strange it is."""

from __future__ import annotations

import json
import math
import time
import tracemalloc
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from dagsched.daemon.batch_loop import decode_record
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.updater import Updater
from dagsched.schemas.messages import (
    MAX_MESSAGE_DEPTH,
    BadMessage,
    DeadLetterMsg,
    decode,
    nesting_depth,
)
from dagsched.schemas.topics import ALLOWED_TYPES
from dagsched.settings import load_settings
from tests.bad_input import (
    any_input,
    bad_number_messages,
    deep_nesting,
    depth,
    encode,
    json_values,
    task_spec,
    unicode_id_messages,
    workflow,
)


def fast(n: int) -> Any:
    """Hypothesis settings for an in-process property: `n` examples, no per-example deadline
    (a loaded CI host is slow now and then; the suite's time is what is budgeted)."""
    return settings(max_examples=n, deadline=None, suppress_health_check=[HealthCheck.too_slow])


SETTINGS = load_settings("test", environ={})
LIMIT = SETTINGS.daemon.max_message_bytes
UPDATER = Updater(SETTINGS, None, None, DaemonMetrics())  # type: ignore[arg-type]


def floats_in(value: Any) -> list[float]:
    if isinstance(value, BaseModel):
        return floats_in(value.model_dump())
    if isinstance(value, dict):
        return [f for v in value.values() for f in floats_in(v)]
    if isinstance(value, list | tuple):
        return [f for v in value for f in floats_in(v)]
    return [value] if isinstance(value, float) else []


def outcome(raw: bytes | None) -> Any:
    """What the daemon's decoding makes of `raw`: the message, or the reason it is refused."""
    try:
        return decode_record(raw, LIMIT, SETTINGS.daemon.max_message_depth)
    except BadMessage as exc:
        return exc.reason


@fast(150)
@given(any_input() | st.none())
@example(b'{"schema_version":1,"type":[]}')  # an unhashable type once raised TypeError
def test_every_input_decodes_or_has_a_one_line_reason(raw):
    try:
        msg = decode(raw)
    except BadMessage as exc:
        assert exc.reason and "\n" not in exc.reason
        assert outcome(raw) == exc.reason  # the daemon's fast path refuses it the same way
        return
    # what decodes is a message the daemon can act on: finite, and the same once re-encoded
    assert all(math.isfinite(f) for f in floats_in(msg))
    assert decode(msg.encode()) == msg
    assert outcome(raw) == msg


@fast(100)
@given(any_input())
def test_the_updater_applies_an_event_or_names_why_not(raw):
    rec = SimpleNamespace(topic="dagsched.events", value=raw)
    try:
        msg = UPDATER.decode(rec)
    except BadMessage as exc:
        assert exc.reason and "\n" not in exc.reason
    else:
        assert msg.type in ALLOWED_TYPES["events"]


@fast(150)
@given(json_values, st.sampled_from([None, 2]), st.booleans())
@example(["\\", [['\\"']]], None, True)
@example({'"[': [{"]]]]": "\\"}]}, None, False)
def test_nesting_depth_is_the_depth_of_any_json(doc, indent, ascii_only):
    text = json.dumps(doc, indent=indent, ensure_ascii=ascii_only).encode()
    assert nesting_depth(text, limit=100) == depth(doc)
    assert nesting_depth(text, limit=1) == min(depth(doc), 2)


@fast(30)
@given(deep_nesting())
def test_deep_nesting_is_refused_before_any_parser_sees_it(raw):
    started = time.perf_counter()
    assert outcome(raw) == f"JSON nested deeper than the limit of {MAX_MESSAGE_DEPTH} levels"
    assert time.perf_counter() - started < 1.0


@fast(100)
@given(bad_number_messages())
def test_bad_numbers_never_reach_the_daemon(raw):
    got = outcome(raw)
    if isinstance(got, str):
        return
    assert all(math.isfinite(f) for f in floats_in(got))
    for token in (b"NaN", b"Infinity", b"1e999", b"9" * 5000):
        assert token not in raw  # only an in-range value may have been accepted


@fast(60)
@given(unicode_id_messages())
def test_unicode_ids_are_accepted_only_as_the_schema_spells_them(raw):
    got = outcome(raw)
    doc = json.loads(raw)
    ident = doc.get("workflow_id", doc.get("node"))
    if isinstance(got, str):
        field = "workflow_id" if "workflow_id" in doc else "node"
        assert f".{field}:" in got, got
    else:
        assert ident.isascii() and 1 <= len(ident) <= 200


@fast(10)
@given(st.integers(LIMIT + 1, 10_000_000), st.sampled_from([b"[", b"x", b'{"a":1}']))
def test_a_record_over_the_size_limit_is_refused_unread(size, filler):
    raw = (filler * (size // len(filler) + 1))[:size]
    tracemalloc.start()
    try:
        got = outcome(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert got == f"message of {size} bytes is over the size limit of {LIMIT} bytes"
    assert peak < 64 * 1024  # nothing of it was copied or parsed


def test_memory_of_decoding_is_bounded_by_the_size_limit():
    # decoding takes a small multiple of a message's size (1 MiB here; tracemalloc is slow)
    n = 1024 * 1024 // len(encode(task_spec("t000000")))
    raw = encode(workflow("big", n - 100, edges=[]))
    assert len(raw) <= LIMIT
    tracemalloc.start()
    try:
        msg = outcome(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(msg, str), msg
    assert peak < 40 * len(raw), f"decoding {len(raw)} bytes peaked at {peak} bytes"


def test_a_workflow_of_100_000_tasks_is_refused_unread():
    tasks = b",".join([encode(task_spec())] * 100_000)
    raw = b'{"schema_version":1,"type":"workflow","workflow_id":"huge","tasks":[%s]}' % tasks
    assert len(raw) > LIMIT
    assert outcome(raw) == f"message of {len(raw)} bytes is over the size limit of {LIMIT} bytes"


def test_a_dead_letter_of_an_oversized_input_keeps_its_head_and_size():
    raw = b"x" * 10_000_000
    dead = DeadLetterMsg.of(raw, b"k" * 100_000, "t", 0, 7, "too big", 1.0, whole=False)
    again = decode(dead.encode())
    assert again.original == raw[: len(again.original)] and len(again.original) == 64 * 1024
    assert again.original_size == len(raw)
    assert len(dead.encode()) < 200_000
