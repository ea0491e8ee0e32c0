"""Warm-up: a scheduler places synthetic batches of the shapes serving hands it, before it serves.

A scheduler's first calls pay for what later calls find ready: numba loading (or, with no
cache on disk, compiling) each compiled kernel, the model's numpy mirror, the BLAS pool's
controller, the first-call caches of numpy and of the policy. The daemon warms every
scheduler it serves before `/healthz` says ready, and a hot-loaded version before it is
swapped in, so that neither a started daemon nor a new version decides its first backlog at
a fraction of its warm rate.

The batches are built the way the daemon builds them (`redis_state.build_view` for the
cluster, read-only done/active masks, parents' nodes, a previous attempt's node, family
history on some tasks) on the configured cluster with part of it in use, for batch sizes
from one task to `daemon.batch_max`: the types, and so the compiled specialisations, are
serving's. Nothing is written anywhere: no Redis, no Kafka, no decision log.
"""

from __future__ import annotations

import time

import numpy as np

from dagsched.core.history import FamilySummary
from dagsched.core.scheduler import Scheduler
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.daemon.redis_state import build_view
from dagsched.settings import Settings

BATCH_SIZES = (1, 2, 16, 64, 256)  # capped at daemon.batch_max
WORKFLOW_SIZES = (3, 8, 20, 40)  # tasks per synthetic workflow, cycled


def cluster_view(settings: Settings) -> ClusterView:
    """The configured cluster (`sim.cluster`: the node groups heartbeats announce) as the
    daemon reads it from Redis, every node alive and about a third of it in use."""
    c = settings.sim.cluster
    cols: dict[str, list[str]] = {
        k: []
        for k in ("id", "kind", "zone", "cores", "mem_gb", "gpu_mem_gb", "net_gbps", "alive",
                  "free_cores", "free_mem", "queue_len", "queued_core_s", "used_cores",
                  "used_mem_gb")
    }  # fmt: skip
    for g in c.groups:
        for _ in range(g.count):
            i = len(cols["id"])
            share = (i % 3) / 3  # a third idle, a third a third used, a third two thirds
            row = {
                "id": f"warmup-{i:05d}",
                "kind": g.kind,
                "zone": str(i % max(1, c.zones)),
                "cores": repr(float(g.cores)),
                "mem_gb": repr(float(g.mem_gb)),
                "gpu_mem_gb": repr(float(g.gpu_mem_gb)),
                "net_gbps": repr(float(g.net_gbps)),
                "alive": "1",
                "free_cores": repr(g.cores * (1 - share)),
                "free_mem": repr(g.mem_gb * (1 - share)),
                "queue_len": str(i % 2),
                "queued_core_s": repr(float(i % 2) * 60.0),
                "used_cores": repr(g.cores * share * 0.5),
                "used_mem_gb": repr(g.mem_gb * share * 0.7),
            }
            for k, v in row.items():
                cols[k].append(v)
    return build_view(len(cols["id"]), cols, 0.0, c.speed)


def _workflow(i: int, size: int) -> Workflow:
    """A layered DAG of `size` tasks of every type, two families per type."""
    types = list(TaskType)
    specs = [
        TaskSpec(
            f"warmup-{t % 7}",
            types[t % len(types)],
            duration_s=20.0 + 10.0 * (t % 5),
            cpu_cores=1.0 + (t % 4),
            mem_gb=2.0 + 2.0 * (t % 3),
            output_bytes=1e7 * (t % 2),
            family=f"warmup-{types[t % len(types)].name.lower()}-{t % 2}",
        )
        for t in range(size)
    ]
    edges = [(t // 3, t) for t in range(1, size)]  # each task's parent a layer above
    return Workflow.build(f"warmup-{i}", specs, edges, arrival_s=0.0)


def _history(wf: Workflow, idx: int) -> FamilySummary | None:
    """Family history for half of the tasks (the other half of families never observed)."""
    if idx % 2:
        return None
    return FamilySummary(
        count=12, cpu_p50=0.5, cpu_p90=0.8, mem_p50=0.6, mem_p90=0.9,
        runtime_ratio=1.1, runtime_p90=1.6, ooms=idx % 3, oom_limit=1.2,
    )  # fmt: skip


def tasks(n: int, n_nodes: int) -> list[TaskView]:
    """`n` ready tasks over synthetic workflows, as `placing.Placer` builds them: a task's
    parents done on some node, its siblings ready or active, now and then a retry."""
    out: list[TaskView] = []
    i = 0
    while len(out) < n:
        wf = _workflow(i, WORKFLOW_SIZES[i % len(WORKFLOW_SIZES)])
        layer = [t for t in range(wf.size) if wf.parents[t] and wf.parents[t][0] == 0]
        ready = layer or [0]
        done = np.zeros(wf.size, dtype=bool)
        done[0] = bool(layer)
        active = np.zeros(wf.size, dtype=bool)
        active[ready] = True
        done.flags.writeable = False
        active.flags.writeable = False
        for t in ready[: n - len(out)]:
            attempt = int(t % 5 == 0)
            out.append(
                TaskView(
                    workflow=wf,
                    idx=t,
                    attempt=attempt,
                    done=done,
                    active=active,
                    parent_nodes=[(t * 7) % n_nodes for _ in wf.parents[t]],
                    prev_node=(t * 3) % n_nodes if attempt else -1,
                    sub_deadline_s=wf.deadline_s * (t + 1) / wf.size,
                    history=_history(wf, t),
                )
            )
        i += 1
    return out


def warm_up(sched: Scheduler, settings: Settings) -> float:
    """Place every warm-up batch with `sched` (its placements are thrown away); the seconds it
    took. A scheduler that fails here is not refused: serving has its own fallback."""
    began = time.perf_counter()
    view = cluster_view(settings)
    sizes = sorted({min(b, settings.daemon.batch_max) for b in BATCH_SIZES})
    for size in sizes:
        sched.place(view, tasks(size, view.n))
    return time.perf_counter() - began


def main() -> None:
    """`python -m dagsched.daemon.warmup`: place the warm-up batches with the shipped champion
    and the heuristic, so that numba compiles the served path's kernels into its cache
    (`NUMBA_CACHE_DIR`, else next to the source when writable). An image build runs it: a
    container's daemon then loads the kernels at start instead of compiling them."""
    from dagsched.daemon.arms import make_fallback
    from dagsched.policy.bundle import load_bundle
    from dagsched.registry.store import SHIPPED_CHAMPION
    from dagsched.settings import load_settings

    settings = load_settings(None, {})
    began = time.perf_counter()
    champion = load_bundle(SHIPPED_CHAMPION, "shipped")
    warm_up(champion, settings)
    warm_up(make_fallback(settings.daemon.fallback_policy), settings)
    print(f"served path compiled and cached in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
