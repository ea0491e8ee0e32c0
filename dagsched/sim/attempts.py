"""The simulator's books on attempts: what an attempt holds while it runs, what was measured
of it when it ends (`AttemptRecord`, the attempt log), its reward, and the completion term
handed to decisions.

`AttemptLedger` is a collaborator the engine holds, as decima-sim's environment holds its
reward calculator: it owns the attempt log, the outcome hook and the completion term's
running sums. An attempt is counted in when it starts (`hold`) and out when it ends (`end`,
which releases its reservation and logs what it used); `outcome` turns the ended attempt into
a `TaskOutcome` and its reward for `on_outcome`, with the share of workflow-seconds its
decision was credited (`credit`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from dagsched.sim.cluster import Cluster
from dagsched.sim.config import RewardWeights
from dagsched.sim.metrics import Metrics
from dagsched.sim.reward import TaskOutcome, decision_reward, dominant_core_s
from dagsched.sim.runs import TaskRun
from dagsched.sim.usage import UsageMeter

# (task, outcome, reward): called once per decided attempt, when it ends
OutcomeHook = Callable[[TaskRun, TaskOutcome, float], None]


class AttemptRecord(NamedTuple):
    """One ended attempt, with what was measured of it (the simulator's attempt log)."""

    wf_id: str
    idx: int
    attempt: int
    node: int
    start_s: float
    compute_start_s: float
    end_s: float
    outcome: str  # done, oom, transient, node_down, cancelled
    res_cores: float
    res_mem: float
    cpu_core_s: float  # measured: cores used x compute seconds
    peak_mem_gb: float  # measured: peak memory (the limit, after an OOM kill)
    runtime_s: float  # measured: compute seconds
    transfer_s: float  # measured: seconds waiting for inputs


class AttemptLedger:
    """Counts attempts in and out and rewards their decisions."""

    def __init__(
        self,
        cluster: Cluster,
        metrics: Metrics,
        usage: UsageMeter,
        weights: RewardWeights,
        *,
        on_outcome: OutcomeHook | None = None,
        keep_log: bool = False,
    ) -> None:
        self.cluster = cluster
        self.metrics = metrics
        self.usage = usage
        self.weights = weights
        self.on_outcome = on_outcome
        self.log: list[AttemptRecord] | None = [] if keep_log else None
        self._credited_wf_s = 0.0  # workflow-seconds handed to decisions so far
        self._charged_wf_s = 0.0  # failed workflows' remaining time, for the next decision
        self._instant_s = -1.0  # the latest instant with decisions ...
        self._instant: list[TaskRun] = []  # ... its decisions so far ...
        self._pool = 0.0  # ... and the workflow-seconds they share

    # -- the completion term ------------------------------------------------------------------

    def credit(self, t: TaskRun, now: float) -> None:
        """A decision now. The decisions of one instant share, equally, the time workflows
        spent in the system since the previous instant with decisions, plus the charges of
        workflows that failed meanwhile; equal shares make it independent of the order the
        batch is placed in, so the online learner can rebuild it from events. (A task
        requeued before it started keeps its earlier decision's share: they add up.)"""
        if now != self._instant_s:
            self._settle()
            self._instant_s = now
            now_wf_s = self.metrics.wf_seconds(now)
            self._pool = now_wf_s - self._credited_wf_s + self._charged_wf_s
            self._credited_wf_s, self._charged_wf_s = now_wf_s, 0.0
        self._instant.append(t)

    def charge(self, wf_s: float) -> None:
        """A failed workflow's remaining time, handed to the next instant's decisions."""
        self._charged_wf_s += wf_s

    def _settle(self) -> None:
        """Hand the current instant's pool to its decisions."""
        if self._instant:
            share = self._pool / len(self._instant)
            for t in self._instant:
                t.credit += share
            self._instant, self._pool = [], 0.0

    # -- an attempt's use ---------------------------------------------------------------------

    def hold(self, t: TaskRun, sign: float, now: float) -> None:
        """Count an attempt's reservation and real use in (sign 1) or out (sign -1)."""
        use_c = t.use_cores if t.use_cores < t.res_cores else t.res_cores
        use_m = 0.5 * (t.peak_mem if t.peak_mem < t.res_mem else t.res_mem)  # mean of a ramp
        self.usage.hold(t.node, t.res_cores, t.res_mem, use_c, use_m, sign, now)

    def end(self, t: TaskRun, outcome: str, now: float) -> tuple[float, float, float]:
        """Release the reservation and account its cost and use; the attempt ends now.
        Returns what was measured: (core-seconds used, peak memory GB, compute seconds)."""
        c, node = self.cluster, t.node
        c.release(node, t.res_cores, t.res_mem)
        self.hold(t, -1.0, now)
        c.running[node].discard(t)
        t.token += 1
        t.end_s = now
        held = now - t.start_s
        computed = now - t.compute_start_s
        if computed < 0.0:
            computed = 0.0
        used_cores = t.res_cores if t.res_cores < t.use_cores else t.use_cores
        used = used_cores * computed
        # memory grows linearly to its peak over the whole compute; an OOM kill at the limit
        peak = t.peak_mem if t.peak_mem < t.res_mem else t.res_mem
        if outcome == "oom":
            peak = t.res_mem
        elif outcome != "done" and 0 < computed < t.compute_s:
            peak *= computed / t.compute_s
        self.metrics.attempt_ended(node, t.res_cores * held, used)
        if self.log is not None:
            self.log.append(
                AttemptRecord(
                    t.run.wf.id,
                    t.idx,
                    t.attempt,
                    node,
                    t.start_s,
                    t.compute_start_s,
                    now,
                    outcome,
                    t.res_cores,
                    t.res_mem,
                    used,
                    peak,
                    computed,
                    t.transfer_s,
                )
            )
        return used, peak, computed

    def outcome(self, t: TaskRun, failed: bool, now: float) -> None:
        """The attempt's reward, emitted to `on_outcome`."""
        if self._instant:
            self._settle()
        run, c, node = t.run, self.cluster, t.node
        late = 0.0 if failed else max(0.0, now - run.sub_deadline_s(t.idx))
        cores, spec = c.cores_list[node], t.spec
        o = TaskOutcome(
            lateness=late / run.wf.deadline_s,
            failed=failed,
            reserved_core_s=dominant_core_s(t.cpu, t.mem, cores, now - t.start_s),
            ideal_core_s=dominant_core_s(
                spec.cpu_cores / cores, spec.mem_gb / c.mem_list[node], cores, spec.duration_s
            ),
            jain_at_decision=t.decided_jain,
            migrated=t.prev_node >= 0 and t.prev_node != node,
            transfer_s=t.transfer_s,
            compute_s=now - t.compute_start_s if now > t.compute_start_s else 0.0,
        )
        o.completion_wf_s, t.credit = t.credit, 0.0
        r = decision_reward(o, self.weights)
        self.metrics.total_reward += r
        if self.on_outcome is not None:
            self.on_outcome(t, o, r)
