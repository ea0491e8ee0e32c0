"""ClusterView's batch copy: later tasks of a batch see the earlier placements, as the
simulator itself will."""

from __future__ import annotations

import pytest

from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.sim.engine import Simulator
from dagsched.sim.runs import Decision
from dagsched.sim.snapshot import cluster_view, task_view
from tests.sim.conftest import small_scenario


def test_take_reserves_where_it_fits_and_queues_where_it_does_not() -> None:
    sc = small_scenario(nodes=4, workflows=1, node_failure_per_hour=0.0, transient=0.0)
    spec = TaskSpec("t", TaskType.CPU, duration_s=100.0, cpu_cores=2.0, mem_gb=4.0)
    wf = Workflow.build("w", [spec, spec, spec], [], deadline_s=1000.0)  # three entry tasks
    sim = Simulator(sc, [wf], seed=0)
    batch = sim.advance()
    assert batch is not None and len(batch) == 3
    cv = cluster_view(sim)
    # a hand-worked case on node 0: a CPU node of 32 cores and 128 GB, 1.5x speed on CPU tasks
    assert (cv.cores[0], cv.mem_gb[0], cv.speed[0, int(TaskType.CPU)]) == (32, 128, 1.5)
    view = cv.batch_copy()
    steps = [(0.5, 0.25), (0.9, 0.8), (0.1, 0.2)]
    fits = [
        view.take(task_view(t), 0, cpu, mem) for t, (cpu, mem) in zip(batch, steps, strict=True)
    ]
    # 0.5 x 32 cores and 0.25 x 128 GB fit; 0.9 x 32 no longer does, so it queues; 0.1 fits
    # and starts now, past the queued one: nodes backfill
    assert fits == [True, False, True]
    assert view.free_cores[0] == pytest.approx(12.8) and view.free_mem[0] == pytest.approx(70.4)
    assert view.queue_len[0] == 1
    # queued work at the advertised speed: 0.9 x 32 cores x 100 s / 1.5
    assert view.queued_core_s[0] == pytest.approx(2880 / 1.5)
    assert cv.queue_len[0] == 0 and cv.free_cores[0] == 32  # the original is intact

    # the simulator, given the same placements, ends up where the view said it would
    for t, (cpu, mem) in zip(batch, steps, strict=True):
        sim.place(Decision(t, 0, cpu, mem, 2))
    c = sim.cluster
    assert c.free_cores[0] == view.free_cores[0] and c.free_mem[0] == view.free_mem[0]
    assert c.queue_len[0] == view.queue_len[0]
    assert c.queued_core_s[0] == pytest.approx(view.queued_core_s[0])
