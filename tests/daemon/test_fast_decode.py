"""The batch loop's fast path for `task_ready` and `workflow` records (`decode_record`) accepts
what `decode` accepts, as the same message, and refuses what it refuses, with its reason."""

from __future__ import annotations

import pytest

from dagsched.daemon.batch_loop import decode_record
from dagsched.schemas.messages import (
    BadMessage,
    TaskReadyMsg,
    TaskSpecMsg,
    WorkflowMsg,
    decode,
)

WF = WorkflowMsg(
    workflow_id="wf-1",
    tasks=[
        TaskSpecMsg(name=f"t{i}", type="io", duration_s=3.5, cpu_cores=2, mem_gb=1.5)
        for i in range(3)
    ],
    edges=[(0, 1), (1, 2)],
    deadline_s=100.0,
    arrival_s=2.0,
).encode()
READY = TaskReadyMsg(workflow_id="wf-1", task=2, attempt=1, at=3.25).encode()

CASES = [
    WF,
    READY,
    WF.replace(b'"cpu_cores":2.0', b'"cpu_cores":"2"'),  # strict: a string is no number
    WF.replace(b'"duration_s":3.5', b'"duration_s":NaN', 1),
    WF.replace(b'"deadline_s":100.0', b'"deadline_s":-1'),
    WF.replace(b'"edges":[[0,1],[1,2]]', b'"edges":[[0,1],[1,2.5]]'),
    WF.replace(b'"arrival_s":2.0', b'"arrival_s":2.0,"extra":1'),
    WF[:-1],  # truncated JSON
    WF.replace(b'"schema_version":1', b'"schema_version":2'),
    READY.replace(b'"attempt":1', b'"attempt":-1'),
    READY.replace(b'"task":2', b'"task":true'),
    READY + b" []",
    b"\xff" + READY,
    None,
]


@pytest.mark.parametrize("raw", CASES, ids=range(len(CASES)))
def test_the_fast_path_decides_as_decode_does(raw):
    try:
        want = decode(raw)
    except BadMessage as exc:
        with pytest.raises(BadMessage) as got:
            decode_record(raw)
        assert got.value.reason == exc.reason
    else:
        assert decode_record(raw) == want
        assert type(decode_record(raw)) is type(want)
