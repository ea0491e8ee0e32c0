"""The wire contract: every message round-trips; bad input is rejected with a readable reason."""

from __future__ import annotations

import pytest

from dagsched.core.wire import to_message, to_workflow
from dagsched.core.workflow import WorkflowError
from dagsched.schemas.messages import (
    BadMessage,
    DeadLetterMsg,
    DecisionMsg,
    NodeDownMsg,
    NodeHeartbeatMsg,
    NodeUpMsg,
    TaskFailedMsg,
    TaskFinishedMsg,
    TaskReadyMsg,
    TaskSpecMsg,
    TaskStartedMsg,
    WorkflowMsg,
    decode,
)

EXAMPLES = [
    WorkflowMsg(
        workflow_id="wf-1",
        deadline_s=120,
        edges=[(0, 1)],
        tasks=[
            TaskSpecMsg(
                name="extract", type="io", duration_s=20, cpu_cores=2, mem_gb=4, output_bytes=2e9
            ),
            TaskSpecMsg(name="train", type="gpu", duration_s=60, cpu_cores=4, mem_gb=32),
        ],
    ),
    TaskReadyMsg(workflow_id="wf-1", task=0, attempt=0),
    DecisionMsg(
        workflow_id="wf-1",
        task=0,
        attempt=0,
        node="node-0003",
        cpu=0.25,
        mem=0.2,
        max_retries=3,
        model_version="v4",
        arm="champion",
        log_prob=-1.2,
        decided_at=1.7e9,
        latency_ms=3.1,
    ),
    TaskStartedMsg(workflow_id="wf-1", task=0, attempt=0, node="node-0003", at=12.5),
    TaskFinishedMsg(
        workflow_id="wf-1",
        task=0,
        attempt=0,
        node="node-0003",
        at=40.0,
        cpu_core_s=55.0,
        peak_mem_gb=3.9,
    ),
    TaskFailedMsg(
        workflow_id="wf-1",
        task=1,
        attempt=0,
        node="node-0001",
        at=41.0,
        reason="oom",
        cpu_core_s=10.0,
        peak_mem_gb=32.0,
    ),
    NodeHeartbeatMsg(
        node="node-0003",
        at=30.0,
        kind="io",
        zone=1,
        cores=16,
        mem_gb=64,
        used_cores=4,
        used_mem_gb=8,
        queue_len=0,
    ),
    NodeDownMsg(node="node-0001", at=50.0),
    NodeUpMsg(node="node-0001", at=650.0),
    DeadLetterMsg.of(b"{oops", b"wf-1", "dagsched.tasks", 2, 17, "invalid JSON", 1.7e9),
]


@pytest.mark.parametrize("msg", EXAMPLES, ids=lambda m: m.type)
def test_round_trip(msg):
    assert decode(msg.encode()) == msg
    assert b'"schema_version":1' in msg.encode()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"", "invalid JSON"),
        (b"nope", "invalid JSON"),
        (b"3", "expected a JSON object, got int"),
        (b'{"schema_version": 2, "type": "task_ready"}', "unknown schema_version 2"),
        (b'{"schema_version": true, "type": "task_ready"}', "unknown schema_version True"),
        (
            b'{"schema_version": 1, "type": "task_ready", "workflow_id": "w", "task": 0,'
            b' "attempt": -1}',
            "task_ready.attempt: Input should be greater than or equal to 0",
        ),
        (
            b'{"schema_version": 1, "type": "decision", "workflow_id": "w", "task": 0,'
            b' "attempt": 0,'
            b' "node": "n", "cpu": 0.95, "mem": 0.5, "max_retries": 2, "model_version": "v",'
            b' "arm": "champion", "decided_at": 1, "latency_ms": 1}',
            "decision.cpu",
        ),
        (
            b'{"schema_version": 1, "type": "task_ready", "workflow_id": "", "task": 0}',
            "task_ready.workflow_id",
        ),
    ],
)
def test_bad_input_has_a_readable_reason(raw, reason):
    with pytest.raises(BadMessage) as err:
        decode(raw)
    assert reason in err.value.reason
    assert "\n" not in err.value.reason


def test_workflow_conversion_catches_cycles_and_size():
    wf = EXAMPLES[0]
    assert to_message(to_workflow(wf, 10)) == wf
    cyclic = wf.model_copy(update={"edges": [(0, 1), (1, 0)]})
    with pytest.raises(WorkflowError, match="cycle"):
        to_workflow(cyclic, 10)
    with pytest.raises(WorkflowError, match="more than the 1 allowed"):
        to_workflow(wf, 1)
