"""The reward's completion term, rebuilt from the event stream as the simulator computes it.

`AttemptLedger.credit`: the decisions of one instant share equally the workflow-seconds spent
in the system since the previous instant with decisions, plus, for each workflow that
failed meanwhile, the time left to its deadline. Here the instants are the job-queue times
of `task_ready` messages (a task is decided at the instant it becomes ready), workflows
enter at their arrival and leave with their last `task_finished`, or with the failure that
exhausts a task's retries. Exact when every message up to a decision's instant has been seen
before its attempt ends, which holds for a replay read in order and, up to stragglers,
in production.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

Key = tuple[str, int]  # (workflow_id/task, attempt)


@dataclass
class TimeInSystem:
    """Workflows' time in the system and the decision instants, from wire messages."""

    arrival: dict[str, float] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)  # absolute deadline
    size: dict[str, int] = field(default_factory=dict)
    left: dict[str, float] = field(default_factory=dict)  # when it finished or failed
    done: dict[str, set[int]] = field(default_factory=dict)
    ready_at: dict[Key, float] = field(default_factory=dict)
    per_instant: dict[float, int] = field(default_factory=dict)
    instants: list[float] = field(default_factory=list)  # sorted
    charges: list[tuple[float, float]] = field(default_factory=list)  # (time, workflow-s)

    def workflow(self, wf_id: str, arrival_s: float, deadline_s: float, size: int) -> None:
        """A workflow entered the system."""
        self.arrival.setdefault(wf_id, arrival_s)
        self.due.setdefault(wf_id, arrival_s + deadline_s)
        self.size.setdefault(wf_id, size)

    def ready(self, key: Key, at: float) -> None:
        """A task attempt became ready (and is decided) at job-queue time `at`."""
        if key in self.ready_at:
            return
        self.ready_at[key] = at
        if at not in self.per_instant:
            bisect.insort(self.instants, at)
        self.per_instant[at] = self.per_instant.get(at, 0) + 1

    def finished(self, wf_id: str, task: int, at: float) -> None:
        """A task finished; the workflow leaves with its last one."""
        done = self.done.setdefault(wf_id, set())
        done.add(task)
        if len(done) == self.size.get(wf_id, -1) and wf_id not in self.left:
            self.left[wf_id] = at

    def failed(self, wf_id: str, at: float) -> None:
        """The workflow failed at `at`: it leaves, charged as if it stayed to its deadline."""
        if wf_id in self.left or wf_id not in self.arrival:
            return
        self.left[wf_id] = at
        self.charges.append((at, max(0.0, self.due[wf_id] - at)))

    def credit(self, key: Key) -> float:
        """The workflow-seconds the decision of `key` carries (0 if its instant is unknown)."""
        t = self.ready_at.get(key)
        if t is None:
            return 0.0
        i = bisect.bisect_left(self.instants, t)
        prev = self.instants[i - 1] if i > 0 else -math.inf
        pool = sum(c for at, c in self.charges if prev < at <= t)
        for wf_id, arrived in self.arrival.items():
            start = arrived if arrived > prev else prev
            end = min(t, self.left.get(wf_id, math.inf))
            if end > start:
                pool += end - start
        return pool / self.per_instant[t]
