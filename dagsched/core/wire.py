"""Workflow messages <-> `Workflow`, shared by the daemon, the replay and the online learner."""

from __future__ import annotations

from dagsched.core.workflow import TASK_TYPE_NAMES, TaskSpec, TaskType, Workflow, WorkflowError
from dagsched.schemas.messages import TaskSpecMsg, WorkflowMsg


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
