"""Run metrics: accumulated by the simulator as things happen, summarised once at the end."""

from __future__ import annotations

from typing import Any

import numpy as np

METRIC_KEYS: tuple[str, ...] = (
    "workflows",
    "tasks",
    "sla_attainment",
    "mean_jct_s",
    "p95_jct_s",
    "mean_wait_s",
    "makespan_s",
    "cost_core_s",
    "waste_core_s",
    "fairness",
    "migrations",
    "task_failures",
    "oom_kills",
    "reserved_util",
    "used_util",
    "reserved_cpu_util",
    "reserved_mem_util",
    "used_cpu_util",
    "used_mem_util",
    "workflows_failed",
    "node_failures",
    "decisions",
    "total_reward",
)


_UTIL_KEYS = METRIC_KEYS[
    METRIC_KEYS.index("reserved_util") : METRIC_KEYS.index("used_mem_util") + 1
]


def jain(x: np.ndarray) -> float:
    """Jain's fairness index of non-negative values: 1 when all equal."""
    s2 = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * s2)) if s2 > 0 else 1.0


class Metrics:
    """Counters and samples for one run. Memory grows with workflows, not tasks."""

    def __init__(self, n_nodes: int) -> None:
        self.workflows_done = 0
        self.workflows_failed = 0
        self.met_deadline = 0
        self.jct: list[float] = []
        self.tasks_done = 0
        self.wait_sum = 0.0
        self.wait_n = 0
        self.cost_core_s = 0.0
        self.used_core_s = 0.0
        self.node_core_s = np.zeros(n_nodes)
        self.migrations = 0
        self.task_failures = 0
        self.oom_kills = 0
        self.node_failures = 0
        self.node_up_s = 0.0  # node-seconds alive, for the measured failure rate
        self.decisions = 0
        self.total_reward = 0.0
        self.first_arrival = float("inf")
        self.last_end = 0.0
        # workflows in the system and its integral over time (the completion term)
        self.in_system = 0
        self._wf_s = 0.0
        self._wf_s_at = 0.0

    def wf_seconds(self, now: float) -> float:
        """Workflow-seconds spent in the system up to `now`."""
        self._wf_s += self.in_system * (now - self._wf_s_at)
        self._wf_s_at = now
        return self._wf_s

    def enter(self, now: float) -> None:
        """A workflow arrived."""
        self.wf_seconds(now)
        self.in_system += 1

    def workflow_finished(self, arrival: float, end: float, deadline: float) -> None:
        """A workflow's last task finished at `end`."""
        self.wf_seconds(end)
        self.in_system -= 1
        self.workflows_done += 1
        self.jct.append(end - arrival)
        if end - arrival <= deadline + 1e-9:
            self.met_deadline += 1
        self.last_end = max(self.last_end, end)

    def workflow_failed(self, now: float) -> None:
        """A workflow ran out of retries."""
        self.wf_seconds(now)
        self.in_system -= 1
        self.workflows_failed += 1
        self.last_end = max(self.last_end, now)

    def attempt_ended(self, node: int, reserved_core_s: float, used_core_s: float) -> None:
        """Account one attempt's reservation and use (finished, failed or cancelled)."""
        self.cost_core_s += reserved_core_s
        self.used_core_s += used_core_s
        self.node_core_s[node] += reserved_core_s

    def summary(self, util: dict[str, float] | None = None) -> dict[str, Any]:
        """Every metric of METRIC_KEYS as plain Python numbers; `util` holds the utilisation
        ones (`sim.usage.UsageMeter.shares`, zeros when not given)."""
        n_wf = self.workflows_done + self.workflows_failed
        jct = np.asarray(self.jct) if self.jct else np.zeros(1)
        makespan = max(0.0, self.last_end - self.first_arrival) if n_wf else 0.0
        util = util or dict.fromkeys(_UTIL_KEYS, 0.0)
        return {
            "workflows": n_wf,
            "tasks": self.tasks_done,
            "sla_attainment": self.met_deadline / n_wf if n_wf else 0.0,
            "mean_jct_s": float(jct.mean()),
            "p95_jct_s": float(np.percentile(jct, 95)),
            "mean_wait_s": self.wait_sum / self.wait_n if self.wait_n else 0.0,
            "makespan_s": makespan,
            "cost_core_s": self.cost_core_s,
            "waste_core_s": self.cost_core_s - self.used_core_s,
            "fairness": jain(self.node_core_s),
            "migrations": self.migrations,
            "task_failures": self.task_failures,
            "oom_kills": self.oom_kills,
            **{k: util[k] for k in _UTIL_KEYS},
            "workflows_failed": self.workflows_failed,
            "node_failures": self.node_failures,
            "decisions": self.decisions,
            "total_reward": self.total_reward,
        }
