"""What a scheduler sees of the simulator, and a scheduler run inside it.

`cluster_view` and `task_view` build the plain views of `core.view` from the simulator's own
state, as the daemon builds them from Redis; `SchedulerPolicy` adapts any `Scheduler` to the
simulator's `Policy` protocol, so a model is evaluated in simulation through exactly the code
path the daemon serves it with.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from dagsched.core.scheduler import Scheduler
from dagsched.core.view import ClusterView, RunningAttempts, TaskView
from dagsched.sim.runs import Decision, TaskRun, TaskState

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


def cluster_view(sim: Simulator) -> ClusterView:
    """The simulator's cluster now, as a `ClusterView`."""
    c, now = sim.cluster, sim.now
    slowdown = np.array(c.observed_slowdown)
    return ClusterView(
        now=now,
        node_ids=[f"node-{i:04d}" for i in range(c.n)],
        kind=c.kind_idx.copy(),
        zone=np.array([x.zone for x in c.nodes]),
        cores=c.cores,
        mem_gb=c.mem_gb,
        gpu_mem_gb=c.gpu_mem_gb,
        net_gbps=c.net_gbps,
        speed=c.speed,
        alive=np.array(c.alive, dtype=bool),
        free_cores=np.array(c.free_cores),
        free_mem=np.array(c.free_mem),
        queue_len=np.array(c.queue_len, dtype=float),
        queued_core_s=np.array(c.queued_core_s),
        net_in_bytes=np.array([c.net_in_bytes(i, now) for i in range(c.n)]),
        failure_rate=np.array([c.failure_rate(i, now) for i in range(c.n)]),
        slowdown=slowdown,
        used_cores=np.array([u[0] for u in sim.node_use]),
        used_mem=np.array([u[1] for u in sim.node_use]),
        running=running_attempts(sim, slowdown),
    )


def running_attempts(sim: Simulator, slowdown: np.ndarray) -> RunningAttempts:
    """The attempts running now, as a node agent and the job queue know them: each one's
    start and cold start, its declared compute time at its node's advertised speed, and its
    family's predicted runtime ratio, on nodes of measured `slowdown` (the view's:
    `RunningAttempts.on_nodes`)."""
    c, history = sim.cluster, sim.history
    node: list[int] = []
    began: list[float] = []
    advertised: list[float] = []
    ratio: list[float] = []
    ratios: dict[str, float] = {}  # per family, for this call
    for i, running in enumerate(c.running):
        for r in running:
            family = r.spec.family
            x = ratios.get(family)
            if x is None:
                stats = history.get(family)
                x = ratios[family] = stats.runtime_ratio() if stats is not None else 1.0
            node.append(i)
            began.append(r.start_s + r.spec.cold_start_s)
            advertised.append(r.advertised_s)
            ratio.append(x)
    return RunningAttempts.on_nodes(node, began, advertised, ratio, slowdown)


def task_view(t: TaskRun, sim: Simulator | None = None) -> TaskView:
    """A ready task of the simulator as a `TaskView`, with its family's history from `sim`
    (none without it)."""
    run = t.run
    states = np.array([x.state for x in run.tasks])
    return TaskView(
        workflow=run.wf,
        idx=t.idx,
        attempt=t.attempt,
        done=states == TaskState.DONE,
        active=(states == TaskState.READY)
        | (states == TaskState.QUEUED)
        | (states == TaskState.RUNNING),
        parent_nodes=[run.tasks[p].node for p in run.wf.parents[t.idx]],
        prev_node=t.prev_node,
        sub_deadline_s=run.sub_deadline_s(t.idx),
        history=sim.history.summary(t.spec.family) if sim is not None else None,
    )


class PolicyOf:
    """The policy factory of one scheduler (deterministic, so one for every replay's seed): it
    pickles when the scheduler does, so that replays can run in worker processes
    (`sim.replay_pool`)."""

    def __init__(self, scheduler: Scheduler, name: str | None = None) -> None:
        self.scheduler, self.name = scheduler, name

    def __call__(self, seed: int) -> SchedulerPolicy:
        return SchedulerPolicy(self.scheduler, self.name)


class SchedulerPolicy:
    """Run a `Scheduler` inside the simulator."""

    def __init__(self, scheduler: Scheduler, name: str | None = None) -> None:
        self.scheduler = scheduler
        self.name = name or scheduler.version

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        placements = self.scheduler.place(cluster_view(sim), [task_view(t, sim) for t in ready])
        return [
            Decision(t, p.node, p.cpu, p.mem, p.max_retries, p.priority)
            for t, p in zip(ready, placements, strict=True)
        ]
