"""The simulator's books on attempts: what an attempt holds while it runs, what was measured
of it when it ends (`AttemptRecord`, the attempt log), its reward, and the completion term
handed to decisions.

`AttemptAccounting` is a base class of `Simulator` (`sim.engine`), which sets up the state
declared here; it is kept apart from the engine so that an attempt's accounting reads in one
place. An attempt is counted in when it starts (`_hold`) and out when it ends
(`_end_attempt`, which releases its reservation and logs what it used); `_outcome` turns the
ended attempt into a `TaskOutcome` and its reward for `on_outcome`, with the share of
workflow-seconds its decision was credited (`_credit`, `_settle`).
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


class AttemptAccounting:
    """Counts attempts in and out and rewards their decisions; a base of `Simulator`."""

    # set up by `Simulator.__init__`
    cluster: Cluster
    metrics: Metrics
    usage: UsageMeter
    weights: RewardWeights
    now: float
    on_outcome: OutcomeHook | None
    log: list[AttemptRecord] | None
    _credited_wf_s: float  # workflow-seconds handed to decisions so far
    _charged_wf_s: float  # failed workflows' remaining time, for the next decision
    _instant_s: float  # the latest instant with decisions ...
    _instant: list[TaskRun]  # ... its decisions so far ...
    _pool: float  # ... and the workflow-seconds they share

    # -- the completion term ------------------------------------------------------------------

    def _credit(self, t: TaskRun) -> None:
        """A decision now. The decisions of one instant share, equally, the time workflows
        spent in the system since the previous instant with decisions, plus the charges of
        workflows that failed meanwhile; equal shares make it independent of the order the
        batch is placed in, so the online learner can rebuild it from events. (A task
        requeued before it started keeps its earlier decision's share: they add up.)"""
        if self.now != self._instant_s:
            self._settle()
            self._instant_s = self.now
            now_wf_s = self.metrics.wf_seconds(self.now)
            self._pool = now_wf_s - self._credited_wf_s + self._charged_wf_s
            self._credited_wf_s, self._charged_wf_s = now_wf_s, 0.0
        self._instant.append(t)

    def _settle(self) -> None:
        """Hand the current instant's pool to its decisions."""
        if self._instant:
            share = self._pool / len(self._instant)
            for t in self._instant:
                t.credit += share
            self._instant, self._pool = [], 0.0

    # -- an attempt's use ---------------------------------------------------------------------

    def _hold(self, t: TaskRun, sign: float) -> None:
        """Count an attempt's reservation and real use in (sign 1) or out (sign -1)."""
        use_c = t.use_cores if t.use_cores < t.res_cores else t.res_cores
        use_m = 0.5 * (t.peak_mem if t.peak_mem < t.res_mem else t.res_mem)  # mean of a ramp
        self.usage.hold(t.node, t.res_cores, t.res_mem, use_c, use_m, sign, self.now)

    def _end_attempt(self, t: TaskRun, outcome: str) -> tuple[float, float, float]:
        """Release the reservation and account its cost and use; the attempt ends now.
        Returns what was measured: (core-seconds used, peak memory GB, compute seconds)."""
        c, node, now = self.cluster, t.node, self.now
        c.release(node, t.res_cores, t.res_mem)
        self._hold(t, -1.0)
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

    def _outcome(self, t: TaskRun, failed: bool) -> None:
        """The attempt's reward, emitted to `on_outcome`."""
        if self._instant:
            self._settle()
        run, c, node, now = t.run, self.cluster, t.node, self.now
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
