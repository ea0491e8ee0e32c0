"""Wire messages <-> simulator types (workflows, ended attempts), shared by the daemon, the
replay and the online learner (here, so that the learner need not import the daemon)."""

from __future__ import annotations

from typing import Any, Literal, cast

from dagsched.schemas.messages import TaskFailedMsg, TaskFinishedMsg, TaskSpecMsg, WorkflowMsg
from dagsched.sim.attempts import AttemptRecord
from dagsched.sim.workflow import TASK_TYPE_NAMES, TaskSpec, TaskType, Workflow, WorkflowError


def to_workflow(msg: WorkflowMsg, max_tasks: int) -> Workflow:
    """Build and validate the DAG; raise `WorkflowError` (cycle, dangling edge, too big)."""
    if len(msg.tasks) > max_tasks:
        raise WorkflowError(
            f"workflow {msg.workflow_id!r} has {len(msg.tasks)} tasks, more than the "
            f"{max_tasks} allowed (daemon.max_dag_tasks)"
        )
    specs = [
        TaskSpec(
            name=t.name,
            type=TaskType(TASK_TYPE_NAMES.index(t.type)),
            duration_s=t.duration_s,
            cpu_cores=t.cpu_cores,
            mem_gb=t.mem_gb,
            input_bytes=t.input_bytes,
            output_bytes=t.output_bytes,
            cold_start_s=t.cold_start_s,
            family=t.family or t.name,
        )
        for t in msg.tasks
    ]
    return Workflow.build(
        msg.workflow_id,
        specs,
        msg.edges,
        arrival_s=msg.arrival_s,
        deadline_s=msg.deadline_s,
        source="kafka",
    )


def to_message(wf: Workflow) -> WorkflowMsg:
    """The wire form of a simulator workflow."""
    return WorkflowMsg(
        workflow_id=wf.id,
        tasks=[
            TaskSpecMsg(
                name=t.name,
                type=TASK_TYPE_NAMES[t.type],  # type: ignore[arg-type]
                duration_s=t.duration_s,
                cpu_cores=t.cpu_cores,
                mem_gb=t.mem_gb,
                input_bytes=t.input_bytes,
                output_bytes=t.output_bytes,
                cold_start_s=t.cold_start_s,
                family=t.family if t.family != t.name else None,
            )
            for t in wf.tasks
        ],
        edges=wf.edges,
        deadline_s=wf.deadline_s,
        arrival_s=wf.arrival_s,
    )


_FAILURE_REASONS = ("oom", "node_down", "cancelled")


def end_message(
    r: AttemptRecord, node: str, attempt: int | None = None
) -> TaskFinishedMsg | TaskFailedMsg:
    """The end event a node agent reports for an ended attempt: what it measured of it
    (core-seconds, peak memory, compute and input-wait seconds), never the hidden truth.
    `attempt` renumbers it (the job queue's numbering), else the simulator's is kept."""
    common: dict[str, Any] = {
        "workflow_id": r.wf_id,
        "task": r.idx,
        "attempt": r.attempt if attempt is None else attempt,
        "node": node,
        "at": r.end_s,
        "cpu_core_s": r.cpu_core_s,
        "peak_mem_gb": r.peak_mem_gb,
        "runtime_s": r.runtime_s,
        "transfer_s": r.transfer_s,
    }
    if r.outcome == "done":
        return TaskFinishedMsg(**common)
    reason = r.outcome if r.outcome in _FAILURE_REASONS else "transient"
    return TaskFailedMsg(
        **common, reason=cast(Literal["oom", "transient", "node_down", "cancelled"], reason)
    )
