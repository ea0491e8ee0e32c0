"""Heuristic schedulers over `ClusterView`: the daemon's fallback when no model can serve."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dagsched.core.bounds import CPU_BOUNDS, MEM_BOUNDS
from dagsched.core.scheduler import Placement
from dagsched.core.view import ClusterView, TaskView

FALLBACK_RETRIES = 3


class LeastLoadedScheduler:
    """Kubernetes-style LeastAllocated + BalancedAllocation, reserving each task's demand
    clamped to the bounds; nodes that would OOM are skipped while any other is alive."""

    version = "heuristic:least_loaded"

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        # free resources as fractions of each node, updated the way the simulator's own
        # least-loaded does it (sim.baselines), so that float ties break alike
        free_c = cluster.free_cores.astype(float) / cluster.cores
        free_m = cluster.free_mem.astype(float) / cluster.mem_gb
        queued = cluster.queued_core_s.astype(float).copy()
        out = []
        for tv in tasks:
            spec = tv.workflow.tasks[tv.idx]
            cpu = np.clip(spec.cpu_cores / cluster.cores, *CPU_BOUNDS)
            mem = np.clip(spec.mem_gb / cluster.mem_gb, *MEM_BOUNDS)
            res_c, res_m = cpu * cluster.cores, mem * cluster.mem_gb
            if not cluster.alive.any():
                raise ValueError("no alive node to place on")
            ok = cluster.alive & (res_m >= spec.mem_gb - 1e-9)
            cand = ok if ok.any() else cluster.alive
            c_left, m_left = free_c - cpu, free_m - mem
            low = np.minimum(c_left, m_left)
            fit = cand & (low >= -1e-9)  # nodes backfill: a queue in front does not matter
            if fit.any():
                # LeastAllocated + BalancedAllocation, (c + m) / 2 - |c - m| = 1.5 min - 0.5 max
                score = 3.0 * low - np.maximum(c_left, m_left)
                node = int(np.argmax(np.where(fit, score, -np.inf)))
                free_c[node] -= cpu[node]
                free_m[node] -= mem[node]
            else:
                busy = queued / cluster.cores - free_c
                node = int(np.argmin(np.where(cand, busy, np.inf)))
                # declared work at the advertised speed, as the cluster accounts its queues
                queued[node] += res_c[node] * spec.duration_s / cluster.speed[node, int(spec.type)]
            out.append(Placement(node, float(cpu[node]), float(mem[node]), FALLBACK_RETRIES))
        return out
