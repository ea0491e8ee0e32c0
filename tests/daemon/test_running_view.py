"""The daemon's view knows when each node's running attempts are expected to end, as the
simulator's does: from the starts and ends it is told, what each task declared, the nodes'
measured slowdown and the families' history, never the truth. Without it, a scheduler that
weighs the wait for a full node (`heft_history`, the model's base) reads every node as free
soon."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dagsched.core.bounds import clamp_placement
from dagsched.core.estimates import advertised_run_s
from dagsched.core.workflow import TASK_TYPE_NAMES
from dagsched.daemon.history_store import Declared
from dagsched.daemon.redis_state import RedisState, Reservation
from dagsched.schemas.messages import DecisionMsg
from dagsched.settings import Settings
from dagsched.sim.engine import Simulator
from dagsched.sim.executor import SimExecutor
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.snapshot import cluster_view
from dagsched.sim.truth import TruthConfig


async def test_the_views_first_ends_equal_the_simulators(
    rstate: RedisState, settings: Settings
) -> None:
    """A job queue's traffic on 8 nodes with node crashes and runtimes off their
    declarations: at every decision, the daemon's view (the same events applied) expects
    each node's first running attempt to end when the simulator's view does."""
    wl = replace(settings.sim.workload, workflows=20, size=(4, 12), load=1.2)
    faults = replace(settings.sim.faults, node_failure_per_hour=4.0, repair_mean_s=120.0)
    truth = TruthConfig(runtime_family_sigma=0.5)
    sc = replace(settings.sim, cluster=settings.sim.cluster.scaled(8), workload=wl,
                 faults=faults, truth=truth)  # fmt: skip
    sim = Simulator(sc, generate_workflows(sc, 3), seed=3, keep_log=True)
    ex = SimExecutor(sim)
    policy = make_policy("heft_history", 3)
    compared = busy = 0
    while (batch := sim.advance()) is not None:
        ex.events()
        ex.heartbeats()  # the nodes' slowdown as measured now, as the simulator's view has it
        await rstate.apply_events([m for stream, _, m in ex.outbox if stream == "events"])
        ex.outbox.clear()
        theirs = await rstate.cluster_view()
        theirs.now = sim.now
        ours = cluster_view(sim).first_ends_s()
        assert ours is not None
        np.testing.assert_array_equal(theirs.first_ends_s(), ours)
        compared += 1
        busy += int(np.isfinite(ours).sum())
        for d in policy.decide(sim, batch):
            t, info = d.task, sim.cluster.nodes[d.node]
            attempt = ex.request(t).attempt
            cpu, mem, retries = clamp_placement(d.cpu, d.mem, d.max_retries)
            cores, spec = cpu * info.cores, t.spec
            speed = sim.cluster.speed_rows[d.node][spec.type]
            reservation = Reservation(
                f"{t.run.wf.id}/{t.idx}", attempt, ex.node_ids[d.node], cores, mem * info.mem_gb,
                cores * spec.duration_s / speed, b"{}", fits=True,
                declared=Declared(spec.family, TASK_TYPE_NAMES[spec.type], spec.cpu_cores,
                                  spec.mem_gb, spec.duration_s, spec.cold_start_s),
                advertised_s=advertised_run_s(spec.duration_s, speed, spec.cpu_cores, cores),
            )  # fmt: skip
            assert (await rstate.decide_many([(reservation, "queue")]))[0][0] in ("r", "q")
            decision = DecisionMsg(
                workflow_id=t.run.wf.id, task=t.idx, attempt=attempt, node=ex.node_ids[d.node],
                cpu=cpu, mem=mem, max_retries=retries, model_version="t", arm="fallback",
                decided_at=0.0, latency_ms=0.0, priority=d.priority,
            )  # fmt: skip
            assert ex.apply(t, decision)  # the policy places on nodes the simulator knows alive
    assert compared > 100 and busy > 200  # most decisions saw nodes with attempts running
