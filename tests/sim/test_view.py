"""ClusterView's batch copy: later tasks of a batch see the earlier placements."""

from __future__ import annotations

from dagsched.sim.engine import Simulator
from dagsched.sim.runner import generate_workflows
from dagsched.sim.view import cluster_view, task_view
from tests.sim.conftest import small_scenario


def test_take_reserves_where_it_fits_and_queues_where_it_does_not() -> None:
    sc = small_scenario(nodes=4, workflows=2)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    batch = sim.advance()
    assert batch is not None
    tv = task_view(batch[0])
    spec = tv.workflow.tasks[tv.idx]
    cv = cluster_view(sim)
    view = cv.batch_copy()
    view.take(tv, 0, 0.5, 0.25)
    assert view.free_cores[0] == cv.cores[0] * 0.5
    assert view.free_mem[0] == cv.mem_gb[0] * 0.75
    view.take(tv, 0, 0.9, 0.8)  # no longer fits: it waits in node 0's queue
    assert view.queue_len[0] == 1
    expected = 0.9 * cv.cores[0] * spec.duration_s / cv.speed[0, int(spec.type)]
    assert abs(view.queued_core_s[0] - expected) < 1e-9
    view.take(tv, 0, 0.1, 0.2)  # fits, but the queue is not empty: it queues too
    assert view.queue_len[0] == 2 and view.free_cores[0] == cv.cores[0] * 0.5
    assert cv.queue_len[0] == 0 and cv.free_cores[0] == cv.cores[0]  # the original is intact
