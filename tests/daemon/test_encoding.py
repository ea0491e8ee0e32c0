"""The daemon's hand-built JSON (`dagsched.daemon.encoding`) is what the pydantic models give:
same bytes for a decision, the same message once parsed for a decision batch (numpy values
in a task's view record included), and a model's non-finite number is refused before it could
be encoded."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dagsched.core.history import FamilySummary
from dagsched.core.scheduler import Placement
from dagsched.core.view import TaskView
from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.daemon import encoding
from dagsched.daemon.call_log import PolicyCall
from dagsched.daemon.placing import _check
from dagsched.learner.decision_log import task_view_record
from dagsched.schemas.messages import (
    DecisionBatchMsg,
    DecisionMsg,
    LoggedTaskMsg,
    TaskReadyMsg,
    decode,
)

DECISION = {
    "workflow_id": "wf-00/a.b#1",
    "task": 7,
    "attempt": 2,
    "node": "node-17",
    "cpu": 0.1 + 0.2,  # not short in decimal
    "mem": 0.8,
    "max_retries": 3,
    "model_version": 'v"12\\ é',  # escapes and non-ASCII
    "arm": "champion",
    "log_prob": -1.2345678901234567e-7,
    "decided_at": 1796165929.8281233,
    "latency_ms": 0.0,
}


def test_a_decision_is_the_bytes_the_model_encodes():
    raw = encoding.decision(**DECISION)
    assert raw == DecisionMsg(**DECISION).encode()  # type: ignore[arg-type]
    assert decode(raw) == DecisionMsg(**DECISION)  # type: ignore[arg-type]


def _task_view() -> TaskView:
    specs = [TaskSpec(f"t{i}", TaskType.CPU, 10.0 + i, 1.0, 2.0) for i in range(3)]
    wf = Workflow.build("wf-1", specs, [(0, 1), (0, 2)], arrival_s=5.0)
    done = np.array([True, False, False])
    active = np.array([False, True, True])
    history = FamilySummary(4, 0.5, 0.9, 0.25, 0.75, 1.1, 1.3, 1, 0.6)
    return TaskView(wf, 1, 0, done, active, [3], -1, np.float64(17.25), history)


def test_a_decision_batch_parses_to_what_the_models_build():
    tv = _task_view()
    m = TaskReadyMsg(workflow_id="wf-1", task=1, attempt=0)
    call = PolicyCall("champion", "v3", 1796165929.5, "VIEW")
    unit = list(np.array([0.1, -0.7, 0.33], dtype=np.float32))  # a model's float32s
    p = Placement(2, np.float64(0.45), 1.3, 2, -0.75)  # mem out of [0, 1]: clipped
    call.new[call.add(m, tv, p, ([float(x) for x in unit], 0.5))] = True
    call.add(m, tv, Placement(0, 0.2, 0.3, 1, float("nan")), None)  # not new, no trace
    keys, raw = call.record()  # type: ignore[misc]
    assert keys == ["wf-1/1:0"]
    want = DecisionBatchMsg(
        model_version="v3",
        arm="champion",
        decided_at=1796165929.5,
        view="VIEW",
        tasks=[
            LoggedTaskMsg(
                workflow_id="wf-1",
                task=1,
                attempt=0,
                new=True,
                node_index=2,
                cpu=0.45,
                mem=1.0,
                unit=[float(x) for x in unit],
                log_prob=-0.75,
                value=0.5,
                view=task_view_record(tv),
            ),
            LoggedTaskMsg(
                workflow_id="wf-1",
                task=1,
                attempt=0,
                new=False,
                node_index=0,
                cpu=0.2,
                mem=0.3,
                log_prob=0.0,
                view=task_view_record(tv),
            ),
        ],
    )
    got = decode(raw)
    assert got == want
    assert raw == want.encode()


@pytest.mark.parametrize("field", ["cpu", "mem", "max_retries"])
def test_a_placement_with_a_number_that_is_not_finite_is_refused(field):
    class View:
        n = 2
        alive = np.array([True, True])

    good = {"node": 1, "cpu": 0.5, "mem": 0.5, "max_retries": 2}
    _check([Placement(**good)], View(), 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not finite"):
        _check([Placement(**{**good, field: math.nan})], View(), 1)  # type: ignore[arg-type]
