"""Heuristic schedulers over `ClusterView`: the daemon's fallback when no model can serve."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dagsched.policy.api import Placement
from dagsched.sim.state import CPU_BOUNDS, MEM_BOUNDS
from dagsched.sim.view import ClusterView, TaskView

FALLBACK_RETRIES = 3


class LeastLoadedScheduler:
    """Kubernetes-style LeastAllocated + BalancedAllocation, reserving each task's demand
    clamped to the bounds; nodes that would OOM are skipped while any other is alive."""

    version = "heuristic:least_loaded"

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        free_cores = cluster.free_cores.astype(float).copy()
        free_mem = cluster.free_mem.astype(float).copy()
        queue = cluster.queue_len.astype(float).copy()
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
            fit = cand & (free_cores >= res_c - 1e-9) & (free_mem >= res_m - 1e-9) & (queue == 0)
            if fit.any():
                c_left = free_cores / cluster.cores - cpu
                m_left = free_mem / cluster.mem_gb - mem
                score = (c_left + m_left) * 0.5 - np.abs(c_left - m_left)
                node = int(np.argmax(np.where(fit, score, -np.inf)))
                free_cores[node] -= res_c[node]
                free_mem[node] -= res_m[node]
            else:
                busy = (queued + cluster.cores - free_cores) / cluster.cores
                node = int(np.argmin(np.where(cand, busy, np.inf)))
                queue[node] += 1
                # declared work at the advertised speed, as the cluster accounts its queues
                queued[node] += res_c[node] * spec.duration_s / cluster.speed[node, int(spec.type)]
            out.append(Placement(node, float(cpu[node]), float(mem[node]), FALLBACK_RETRIES))
        return out
