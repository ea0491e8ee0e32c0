"""The replay judge: what a version would change for the whole cluster, from recorded traffic.

A per-workflow A/B on one shared cluster cannot see a change whose gain is congestion it
relieves: both arms sit in the congestion the champion makes. The replay judge plays the
recent traffic again, once per version, in a calibrated replay (`sim.replay_world`): the
same arrivals and cluster, the tasks' use and runtime drawn from the learned per-family
history, the fault rates and the OOM restart time that the events revealed.

- `TrafficRecorder` turns what the evaluator consumes (workflows, heartbeats, attempt ends,
  finished workflows) into `ObservedWindow`s: consecutive, non-overlapping runs of
  `window_workflows` arrivals, each closed once all its workflows have ended (or once two
  later windows have filled), with the `warmup_workflows` arrivals before it replayed first
  to load the cluster, and after it the arrivals that came while its workflows ran (`after`,
  at most `after_workflows`; not counted either: without them the window's last workflows
  would finish on a cluster emptying for want of later traffic, and the replays would
  predict them fast).
- `ReplayJudge.judge` replays a window K times per version with common random numbers
  (replay k of both versions uses one seed: the same task ratios and node crashes), checks
  fidelity (the window replayed as it was served, the challenger on the workflows of its
  slice, against what the window really did: the relative error of mean JCT over the
  workflows the serving version served, pooled over the latest `fidelity_windows` windows
  by `FidelityPool`; above `fidelity_max_jct_err` the verdict is `unreliable` and nothing
  is added; a window that closed before all its workflows ended is compared on JCT cut at
  its close, `fidelity_of`), then feeds the K per-replay differences to the paired mSPRT
  (`sequential.PairedTest`). `ReplayJudge.measure` replays a window no test is fed with
  as it was served, for fidelity only. Windows do not overlap, so
  no replay is counted twice. The K replays of one window share its workflows: by default
  (`variance: replays`) the test asks what the challenger gains on the traffic seen, and
  the per-replay spread is its noise; `variance: windows` also takes the spread between
  windows, to ask about traffic like it. Either way it waits for `min_windows`.
"""

from __future__ import annotations

import copy
import zlib
from collections import deque
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dagsched.core.history import FamilyStats
from dagsched.core.workflow import Workflow
from dagsched.learner.sequential import PAIRED_METRICS, PairedRule, PairedTest, Verdict
from dagsched.service_config import ReplaySettings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.replay_pool import InThread, Replays, play_one
from dagsched.sim.replay_world import (
    NodeSpec,
    PolicyFactory,
    ReplayResult,
    ReplayWorld,
    as_served,
)

UNRELIABLE = "unreliable"
# a window replayed for fidelity only: no test is fed with it
MEASURED = "measured"
# what the restart after an OOM kill costs is estimated from this many latest retries (a
# shifted world's hour-long restart shows within them), against this many other attempts
RECENT_OOM_RETRIES = 20
RECENT_ATTEMPTS = 2000
# the retries after OOM kills kept to date the latest restart cost (they are rare: a few per
# hundred workflows)
KEPT_OOM_RETRIES = 1000
# a retry still running counts towards the restart cost once it has outlived this many times
# its expected run time (as a running task's prediction is raised: `estimates`), at the time
# beyond that: a lower bound of its cost, known before it ends
OUTLIVED_FACTOR = 2.0
# a workflow still in flight this many windows (or warm-ups, the longer) after it arrived is
# taken as one whose end was not reported, and no longer carried into replays
IN_FLIGHT_ARRIVALS = 2


def remainder(wf: Workflow, done: set[int], at_s: float) -> Workflow | None:
    """`wf` cut to its tasks not in `done`, arriving at `at_s` with its own due time (None
    when every task is done). A task that was running restarts: the events do not say how
    far it got."""
    keep = [i for i in range(wf.size) if i not in done]
    if not keep:
        return None
    new = {old: k for k, old in enumerate(keep)}
    edges = [(new[p], new[c]) for c in keep for p in wf.parents[c] if p in new]
    due = wf.arrival_s + wf.deadline_s
    return Workflow.build(
        wf.id, [wf.tasks[i] for i in keep], edges, arrival_s=at_s,
        deadline_s=max(due - at_s, 1.0), source=wf.source,
    )  # fmt: skip


def censored_median(values: Sequence[tuple[float, bool]]) -> float:
    """The Kaplan-Meier median of (value, observed) pairs, where an unobserved value is a
    lower bound (right-censored: a retry still running has cost at least that much).

    A lower bound leaves the estimate when the values pass it instead of counting as a
    value: a burst of fresh OOM kills, whose retries still run, does not pull the median
    below what the retries that ended cost. When the observed values cannot reach half
    (most are still running), the median of the values taken as they are: a lower bound.
    With every value observed, the ordinary median.
    """
    if not values:
        raise ValueError("the median of no values")
    if all(observed for _, observed in values):
        return float(np.median([v for v, _ in values]))
    ordered = sorted(values, key=lambda v: (v[0], not v[1]))  # an end before a bound at a tie
    at_risk, survival = len(ordered), 1.0
    for value, observed in ordered:
        if observed:
            survival *= 1.0 - 1.0 / at_risk
            if survival <= 0.5 + 1e-12:
                return value
        at_risk -= 1
    return float(np.median([v for v, _ in values]))


@dataclass(frozen=True)
class ReplayJudgeConfig:
    """How windows are cut and replayed, and the paired test's rule."""

    window_workflows: int = 100
    warmup_workflows: int = 400
    after_workflows: int = 150  # at most this many later arrivals replayed after the window
    # the workflows in flight when a window's warm-up began, cut to their unfinished tasks,
    # replayed from then on too
    carry_in_flight: bool = False
    replays: int = 16  # K: replays per version per window
    fidelity_max_jct_err: float = 0.15
    # fidelity is measured over the last this many windows replayed as served together,
    # whichever pair each was judged for (`FidelityPool`): one window's mean JCT is too
    # noisy a target (one realisation of a heavy-tailed world)
    fidelity_windows: int = 4
    # a window a challenger's slice shared is replayed as it was served this many times (the
    # first seeds of the K): those replays measure fidelity only. Fewer cost less during a
    # canary, but one replay's window mean is one draw of a heavy-tailed world, and the
    # first judged windows have few others to pool with. None: all K
    fidelity_replays: int | None = None
    rule: PairedRule = field(default_factory=PairedRule)
    seed: int = 0
    # where the replays run (`sim.replay_pool.replays_for`): 1 this thread, 0 one process
    # per core, N that many processes
    workers: int = 1


@dataclass
class ObservedWindow:
    """One window of recorded traffic and what it really did."""

    index: int
    workflows: list[Workflow]  # the counted ones, by arrival
    warmup: list[Workflow]
    jct_s: dict[str, float]  # observed, per workflow that ended
    met: dict[str, bool]
    nodes: list[NodeSpec]
    families: dict[str, FamilyStats]  # the history when the window closed: the learned truth
    history: dict[str, FamilyStats]  # the history when its first replayed workflow arrived
    transient_failure: float = 0.0
    node_failure_per_hour: float = 0.0
    oom_restart_s: float = 0.0
    oom_restart_from_s: float = 0.0  # the time from which that restart cost held
    # workflows, counted or warm-up, served by another version (a challenger's slice,
    # exploration): fidelity replays them under the challenger, so that the replay shares
    # the cluster as the traffic did, and asks how well it predicts what the serving
    # version served
    elsewhere: frozenset[str] = frozenset()
    # the arrivals after the window that came before its last workflow ended (all those known
    # when the window closed without some of them): the traffic its stragglers competed with
    after: list[Workflow] = field(default_factory=list)
    # the workflows in flight when the first warm-up workflow arrived, cut to the tasks not
    # finished then and arriving then (`remainder`): the work the cluster already held
    carried: list[Workflow] = field(default_factory=list)
    # job-queue time the window closed: a workflow not ended by then had run at least this
    # long since its arrival (None: not known)
    closed_s: float | None = None
    # the model version that served each workflow of the replay that had ended by the close
    # (counted, warm-up or later), where known: what a replay as served plays it with
    served_by: dict[str, str] = field(default_factory=dict)

    def cuts(self) -> dict[str, float] | None:
        """When the window closed before all its workflows ended: how long each of them had
        been in the system at the close (what its JCT is cut at); else None."""
        closed = self.closed_s
        if closed is None or all(w.id in self.jct_s for w in self.workflows):
            return None
        return {w.id: max(0.0, closed - w.arrival_s) for w in self.workflows}

    @property
    def mean_jct_s(self) -> float:
        return float(np.mean(list(self.jct_s.values()))) if self.jct_s else 0.0

    @property
    def sla(self) -> float:
        return float(np.mean(list(self.met.values()))) if self.met else 0.0

    def world(self, base: ScenarioConfig, warmup: int | None = None) -> ReplayWorld:
        """The calibrated replay of this window; with `warmup`, of at most that many of the
        arrivals recorded before it (the latest). The policies start from the history of
        the first recorded one either way."""
        before = self.warmup if warmup is None else self.warmup[len(self.warmup) - warmup :]
        return ReplayWorld.build(
            [*self.carried, *before, *self.workflows, *self.after],
            [w.id for w in self.workflows],
            base,
            nodes=self.nodes,
            families=self.families,
            history=self.history,
            transient_failure=self.transient_failure,
            node_failure_per_hour=self.node_failure_per_hour,
            oom_restart_s=self.oom_restart_s,
            oom_restart_from_s=self.oom_restart_from_s,
        )


@dataclass
class _Open:
    index: int
    ids: list[str]
    warmup: list[Workflow]


class TrafficRecorder:
    """Recorded traffic -> `ObservedWindow`s (see the module docstring). Feed it arrivals,
    node heartbeats, attempt ends and finished workflows; take closed windows from `ready`."""

    def __init__(
        self,
        window_workflows: int,
        warmup_workflows: int,
        after_workflows: int = 150,
        carry_in_flight: bool = False,
    ) -> None:
        if window_workflows < 1:
            raise ValueError("window_workflows must be >= 1")
        self.window = window_workflows
        self.warmup = warmup_workflows
        self.after = after_workflows
        self.carry = carry_in_flight
        # arrived, not ended: id -> (workflow, its arrival's index, its finished tasks)
        self._in_flight: dict[str, tuple[Workflow, int, set[int]]] = {}
        self._carried: dict[int, list[Workflow]] = {}  # window -> in flight at its warm-up
        self.arrived: dict[str, Workflow] = {}
        self.order: list[str] = []  # arrivals not yet in a window, plus the warm-up tail
        self.jct_s: dict[str, float] = {}
        self.met: dict[str, bool] = {}
        self.elsewhere: set[str] = set()  # ended workflows another version served
        self.version_of: dict[str, str] = {}  # ended workflows: the version that served it
        self.nodes: dict[str, NodeSpec] = {}
        self.open: list[_Open] = []
        self._tail: list[Workflow] = []  # the last `warmup` arrivals before the next window
        self._next = 0
        self._count = 0  # arrivals so far
        # what the events revealed, since the start
        self.attempts = 0
        self.transient = 0
        self.node_downs = 0
        self.first_s: float | None = None
        self.last_s = 0.0
        # time on the node beyond compute and transfer of the latest finished attempts, after
        # an OOM kill of their task or not: recent ones only, so that a change in what a
        # restart costs shows within a few retries instead of being averaged with the past
        self._overhead: deque[float] = deque(maxlen=RECENT_ATTEMPTS)
        # (start, overhead) of the latest finished retries after an OOM kill, by end
        self._retries: deque[tuple[float, float]] = deque(maxlen=KEPT_OOM_RETRIES)
        # retries after an OOM kill still running: key -> (start, expected run time)
        self._running: dict[Hashable, tuple[float, float]] = {}
        # the history each window's replay starts from: taken (`snapshot`) when the first
        # workflow it replays arrives, as the policies then saw it
        self.pending_snapshots: list[int] = []
        self._history: dict[int, dict[str, FamilyStats]] = {}

    @classmethod
    def of(cls, cfg: ReplayJudgeConfig) -> TrafficRecorder:
        """The recorder of the windows `cfg` judges."""
        return cls(
            cfg.window_workflows, cfg.warmup_workflows, cfg.after_workflows, cfg.carry_in_flight
        )

    # -- feeding ------------------------------------------------------------------------------

    def workflow(self, wf: Workflow) -> None:
        """A workflow arrived (its first sighting counts; redeliveries are ignored)."""
        if wf.id in self.arrived:
            return
        self.arrived[wf.id] = wf
        self._clock(wf.arrival_s)
        self.order.append(wf.id)
        # window k replays from arrival max(0, k x window - warmup) on: that arrival's history
        i, w = self._count, self.window
        self._count += 1
        if i == 0:
            self.pending_snapshots += list(range(self.warmup // w + 1))
        elif (i + self.warmup) % w == 0:
            self.pending_snapshots.append((i + self.warmup) // w)
            if self.carry:
                self._carried[(i + self.warmup) // w] = self._cut_in_flight(i, wf.arrival_s)
        if self.carry:
            self._in_flight[wf.id] = (wf, i, set())
        if len(self.order) >= self.window:
            ids, self.order = self.order[: self.window], self.order[self.window :]
            self.open.append(_Open(self._next, ids, list(self._tail)))
            self._next += 1
            tail = [*self._tail, *(self.arrived[i] for i in ids)]
            self._tail = tail[-self.warmup :] if self.warmup else []

    def _cut_in_flight(self, index: int, at_s: float) -> list[Workflow]:
        """The workflows in flight now, as arrival `index` comes at `at_s`, cut to their
        unfinished tasks. One whose end was never reported (a lost event, an arm whose
        outcomes are not recorded) would be carried for good: those that arrived more than
        `IN_FLIGHT_ARRIVALS` windows' worth of arrivals ago are let go."""
        oldest = index - IN_FLIGHT_ARRIVALS * max(self.window, self.warmup)
        for wid in [k for k, (_, i, _) in self._in_flight.items() if i < oldest]:
            del self._in_flight[wid]
        out = []
        for wf, _, done in self._in_flight.values():
            cut = remainder(wf, done, at_s)
            if cut is not None:
                out.append(cut)
        return out

    def task_finished(self, workflow_id: str, task: int) -> None:
        """A task of a workflow finished (what `carry_in_flight` cuts in-flight work by)."""
        got = self._in_flight.get(workflow_id)
        if got is None:
            return
        got[2].add(task)
        if len(got[2]) >= got[0].size:
            del self._in_flight[workflow_id]

    def snapshot(self, families: Mapping[str, FamilyStats]) -> None:
        """The per-family history now, for the windows waiting for one (a copy is kept)."""
        if self.pending_snapshots:
            copied = copy.deepcopy(dict(families))
            for k in self.pending_snapshots:
                self._history[k] = copied
            self.pending_snapshots = []

    def node(self, node_id: str, spec: NodeSpec) -> None:
        """A node's heartbeat."""
        self.nodes[node_id] = spec

    def node_down(self, at_s: float) -> None:
        self._clock(at_s)
        self.node_downs += 1

    def attempt_ended(
        self, at_s: float, failed: bool, reason: str = "", overhead_s: float | None = None,
        after_oom: bool = False, started_s: float | None = None, key: Hashable = None,
    ) -> None:  # fmt: skip
        """An attempt ended at `at_s` (it started at `started_s`, when known). `overhead_s`:
        for a finished one, its time on the node beyond its measured compute and transfer
        (the restart after an OOM kill shows here). `key`: as `retry_started` took it."""
        self._clock(at_s)
        self._running.pop(key, None)
        self.attempts += 1
        self.transient += failed and reason == "transient"
        if overhead_s is None or failed:
            return
        if after_oom:
            start = started_s if started_s is not None else at_s - overhead_s
            self._retries.append((start, max(0.0, overhead_s)))
        else:
            self._overhead.append(max(0.0, overhead_s))

    def retry_started(self, key: Hashable, at_s: float, expected_s: float) -> None:
        """A retry after an OOM kill started at `at_s`, expected to run `expected_s` (its
        declared compute at the node's speed, times its family's predicted runtime ratio);
        its end is reported with the same `key`. Until then, once it has outlived
        `OUTLIVED_FACTOR` times that, the time beyond counts as a lower bound of its restart
        cost: a restart cost that rose shows while its first retries still run."""
        if key not in self._running and len(self._running) >= KEPT_OOM_RETRIES:
            # the oldest: one whose end event was lost would otherwise be kept for good
            del self._running[next(iter(self._running))]
        self._running[key] = (at_s, max(0.0, expected_s))

    def clock(self, at_s: float) -> None:
        """Time is `at_s` (the latest event's; what a running retry has outlived is read
        against it)."""
        self._clock(at_s)

    def ended(
        self,
        workflow_id: str,
        jct_s: float,
        met: bool,
        served: bool = True,
        version: str | None = None,
    ) -> None:
        """A workflow finished (or failed) after `jct_s` seconds; `served`: by the serving
        version (not a challenger's or the exploration slice); `version`: the model version
        that served it, when one did. A workflow no open or coming window holds (its window
        closed without it) is not kept."""
        self._in_flight.pop(workflow_id, None)
        if workflow_id not in self.arrived:
            return
        self.jct_s[workflow_id] = jct_s
        self.met[workflow_id] = met
        if not served:
            self.elsewhere.add(workflow_id)
        if version is not None:
            self.version_of[workflow_id] = version

    def _clock(self, at_s: float) -> None:
        if self.first_s is None:
            self.first_s = at_s
        self.last_s = max(self.last_s, at_s)

    @property
    def arrivals(self) -> int:
        """Workflows arrived so far (window k holds arrivals k x window to (k+1) x window - 1)."""
        return self._count

    # -- estimates ----------------------------------------------------------------------------

    @property
    def transient_failure(self) -> float:
        return self.transient / self.attempts if self.attempts else 0.0

    @property
    def node_failure_per_hour(self) -> float:
        hours = (self.last_s - (self.first_s or 0.0)) / 3600.0
        n = len(self.nodes)
        return self.node_downs / (n * hours) if n and hours > 0 else 0.0

    def _known_retries(self) -> list[tuple[float, float, bool]]:
        """(start, extra time on the node, ended) of the kept retries after an OOM kill, by
        start: the finished ones, and those still running that have outlived
        `OUTLIVED_FACTOR` times their expected run time, at the time beyond that (at least
        their cost: right-censored)."""
        base = self._base_overhead()
        running = [
            (start, base + late, False)
            for start, expected in self._running.values()
            if (late := self.last_s - start - OUTLIVED_FACTOR * expected) > 0
        ]
        done = [(start, extra, True) for start, extra in self._retries]
        return sorted([*done, *running], key=lambda r: r[0])

    @property
    def oom_restart_s(self) -> float:
        """Median extra time on the node of the latest `RECENT_OOM_RETRIES` attempts that
        followed an OOM kill (by start; a retry still running counts once it has outlived
        its expectation, as right-censored: `censored_median`), beyond the latest other
        attempts' mean. The median, not the mean: OOM kills are rare (a few per hundred
        workflows), so the latest 20 retries span hundreds of workflows, and once most of
        them show a new restart cost, that is the cost, not a blend with the old."""
        latest = [(o, ended) for _, o, ended in self._known_retries()[-RECENT_OOM_RETRIES:]]
        if not latest:
            return 0.0
        return max(0.0, censored_median(latest) - self._base_overhead())

    @property
    def oom_restart_from_s(self) -> float:
        """When the latest restart cost (`oom_restart_s`) began to hold: the change point in
        the kept retries after which the most show it (an extra time nearer to it than to
        none) against those that do not (of two such points, the later), halfway between the
        starts of the two retries that straddle it; 0 when every kept retry shows it. A
        retry still running that does not show it yet says nothing and is left out. A
        replay charges the cost to retries from then on only: charged from the replay's
        start, a cost that changed within the replayed span would slow retries that never
        paid it."""
        cost = self.oom_restart_s
        if cost <= 0:
            return 0.0
        base = self._base_overhead()
        known = [
            (start, o) for start, o, ended in self._known_retries() if ended or o - base >= cost / 2
        ]
        # +1 for a retry that shows the cost, -1 for one that does not; the best suffix sum
        signs = [1 if o - base >= cost / 2 else -1 for _, o in known]
        best, best_at, run = 0, len(signs), 0
        for j in range(len(signs) - 1, -1, -1):
            run += signs[j]
            if run > best:  # a tie keeps the later split: the noise before it is old
                best, best_at = run, j
        if best_at == 0:
            return 0.0
        starts = [s for s, _ in known]
        return (starts[best_at - 1] + starts[best_at]) / 2 if best_at < len(starts) else 0.0

    def _base_overhead(self) -> float:
        """The latest attempts' mean time on the node beyond compute and transfer, not after
        an OOM kill: what any attempt costs."""
        return float(np.mean(self._overhead)) if self._overhead else 0.0

    # -- windows ------------------------------------------------------------------------------

    def ready(self, families: Mapping[str, FamilyStats]) -> list[ObservedWindow]:
        """Windows that closed since the last call: every workflow of the window ended, or
        two later windows filled (its stragglers are then left out of what it observed).
        `families` is the per-family history now (read from Redis or the simulator)."""
        out = []
        while self.closable():
            w = self.open[0]
            self.open.pop(0)
            out.append(self._close(w, families))
        return out

    def closable(self) -> bool:
        """Whether `ready` would close a window now."""
        if not self.open:
            return False
        return len(self.open) >= 3 or all(i in self.jct_s for i in self.open[0].ids)

    def _close(self, w: _Open, families: Mapping[str, FamilyStats]) -> ObservedWindow:
        later = [i for o in self.open for i in o.ids] + self.order  # `w` is out of `open`
        last_end = (
            max(self.arrived[i].arrival_s + self.jct_s[i] for i in w.ids)
            if all(i in self.jct_s for i in w.ids)
            else float("inf")
        )
        after = [
            self.arrived[i] for i in later[: self.after] if self.arrived[i].arrival_s < last_end
        ]
        obs = ObservedWindow(
            index=w.index,
            workflows=[self.arrived[i] for i in w.ids],
            warmup=w.warmup,
            jct_s={i: self.jct_s[i] for i in w.ids if i in self.jct_s},
            met={i: self.met[i] for i in w.ids if i in self.met},
            nodes=list(self.nodes.values()),
            families=dict(families),
            history=self._history.pop(w.index, dict(families)),
            transient_failure=self.transient_failure,
            node_failure_per_hour=self.node_failure_per_hour,
            oom_restart_s=self.oom_restart_s,
            oom_restart_from_s=self.oom_restart_from_s,
            elsewhere=frozenset(
                i
                for i in [*w.ids, *(x.id for x in w.warmup), *(x.id for x in after)]
                if i in self.elsewhere
            ),
            after=after,
            carried=self._carried.pop(w.index, []),
            closed_s=self.last_s,
            served_by={
                i: self.version_of[i]
                for i in [*w.ids, *(x.id for x in [*w.warmup, *after])]
                if i in self.version_of
            },
        )
        needed = {x.id for x in self._tail} | set(self.order)
        for o in self.open:
            needed |= set(o.ids) | {x.id for x in o.warmup}
        for i in [*w.ids, *(x.id for x in w.warmup)]:
            if i not in needed:
                self.arrived.pop(i, None)
                self.elsewhere.discard(i)  # no later window replays it
                self.version_of.pop(i, None)
        for i in w.ids:
            self.jct_s.pop(i, None)
            self.met.pop(i, None)
        return obs


@dataclass
class Fidelity:
    """How well the serving version's replays predict what its window really did."""

    observed_jct_s: float
    predicted_jct_s: float
    jct_err: float | None  # |predicted - observed| / observed; None: nothing to compare
    observed_sla: float
    predicted_sla: float
    sla_err: float | None  # absolute, in SLA points
    compared: int = 0  # workflows compared on JCT
    # of them, still running when their window closed (JCT cut at the close on both sides)
    censored: int = 0

    def off_by_more_than(self, limit: float) -> bool:
        """Whether the replay is not to be trusted: off by more than `limit` of mean JCT,
        or with no workflow to check it on."""
        return self.jct_err is None or self.jct_err > limit

    def describe(self) -> str:
        """The error in words ("mean JCT off by 7.1%"), or why there is none."""
        if self.jct_err is None:
            return "no workflow both observed to end and replayed"
        return f"mean JCT off by {self.jct_err:.1%}"


class FidelityPool:
    """The latest windows replayed as they were served, whatever pair each was judged for
    (or none: `ReplayJudge.measure`), and the fidelity over them together. Fidelity is the
    replay's, not a pair's: a new challenger's first window is pooled with the windows
    before it, not measured alone (one window's mean JCT is one realisation of a
    heavy-tailed world)."""

    def __init__(self, windows: int) -> None:
        self._served: deque[tuple[ObservedWindow, list[ReplayResult]]] = deque(
            maxlen=max(1, windows)
        )

    def add(self, obs: ObservedWindow, served: list[ReplayResult]) -> Fidelity:
        """`obs` replayed as served: the fidelity over the pooled windows, it included."""
        self._served.append((obs, served))
        return fidelity_of(list(self._served))


@dataclass
class WindowReport:
    """One judged window: fidelity (over the pooled windows, and the window's own), the
    per-replay differences, the verdict after it."""

    window: int
    workflows: int
    fidelity: Fidelity
    decision: str  # promote | retire | continue | unreliable | measured
    reason: str
    diffs: list[dict[str, float]] = field(default_factory=list)
    champion: list[dict[str, float]] = field(default_factory=list)
    challenger: list[dict[str, float]] = field(default_factory=list)
    verdict: Verdict | None = None
    own_fidelity: Fidelity | None = None  # this window's alone (reported, not gated on)

    @property
    def gain(self) -> dict[str, float | None]:
        """This window's mean paired differences (challenger better > 0); None unjudged."""
        n = len(self.diffs)
        return {m: sum(d[m] for d in self.diffs) / n if n else None for m in PAIRED_METRICS}

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict.to_dict() if self.verdict is not None else None
        return out


def _summary(r: ReplayResult) -> dict[str, float]:
    return {"mean_jct_s": r.mean_jct_s, "sla": r.sla, "reward": r.reward}


def config_from(cfg: ReplaySettings) -> ReplayJudgeConfig:
    """The judge's configuration from `evaluator.replay` settings."""
    rule = PairedRule(
        alpha=cfg.alpha,
        min_samples=cfg.min_replays,
        max_samples=cfg.max_replays,
        min_windows=cfg.min_windows,
        min_windows_futile=cfg.min_windows_futile,
        variance=cfg.variance,
        tau={"jct": cfg.tau_jct, "sla": cfg.tau_sla, "reward": cfg.tau_reward},
        min_effect={
            "jct": cfg.min_effect_jct,
            "sla": cfg.min_effect_sla,
            "reward": cfg.min_effect_reward,
        },
    )
    return ReplayJudgeConfig(
        window_workflows=cfg.window_workflows,
        warmup_workflows=cfg.warmup_workflows,
        after_workflows=cfg.after_workflows,
        carry_in_flight=cfg.carry_in_flight,
        replays=cfg.replays,
        fidelity_max_jct_err=cfg.fidelity_max_jct_err,
        fidelity_windows=cfg.fidelity_windows,
        fidelity_replays=cfg.fidelity_replays,
        rule=rule,
        seed=cfg.seed,
        workers=cfg.workers,
    )


def paired_diffs(champion: ReplayResult, challenger: ReplayResult) -> dict[str, float]:
    """One replay's differences, challenger minus champion, higher better (`PairedRule`); a
    workflow that failed counts as taking at least two deadlines (`judged_jct_s`)."""
    jb = champion.judged_jct_s
    return {
        "jct": (jb - challenger.judged_jct_s) / jb if jb > 0 else 0.0,
        "sla": challenger.sla - champion.sla,
        "reward": challenger.reward - champion.reward,
    }


def fidelity_of(
    observed: list[tuple[ObservedWindow, list[ReplayResult]]],
) -> Fidelity:
    """The serving version's replays against what its windows really did: mean JCT and SLA
    over the workflows it served, every window's together.

    A window that closed before all its workflows ended (two later windows filled) has
    observed only the ones that ended early, the fast ones; compared with their replays, it
    would call the replay slow. Such a window is compared on JCT cut at its close
    (`ObservedWindow.cuts`), observed and replayed alike: a workflow still running counts
    the time it had been in the system (its arm is not known yet: it is replayed as the
    serving version's), and every replayed JCT is cut at the same time. SLA is compared over
    the workflows that ended."""
    o_j, o_m, p_j, p_m = [], [], [], []
    censored = 0
    for obs, replays in observed:
        cuts = obs.cuts()
        for wf in obs.workflows:
            i = wf.id
            if i in obs.elsewhere:
                continue
            got = [r.jct_s[i] for r in replays if i in r.jct_s]
            cut = cuts[i] if cuts is not None else None
            if not got or (i not in obs.jct_s and cut is None):
                continue
            if i in obs.jct_s:
                o_j.append(obs.jct_s[i] if cut is None else min(obs.jct_s[i], cut))
                o_m.append(obs.met[i])
                p_m.append(float(np.mean([r.met[i] for r in replays if i in r.met])))
            else:
                assert cut is not None
                o_j.append(cut)
                censored += 1
            p_j.append(float(np.mean([x if cut is None else min(x, cut) for x in got])))
    if not o_j:
        return Fidelity(0.0, 0.0, None, 0.0, 0.0, None)
    o_jct, pred_jct = float(np.mean(o_j)), float(np.mean(p_j))
    o_sla = float(np.mean(o_m)) if o_m else 0.0
    pred_sla = float(np.mean(p_m)) if p_m else 0.0
    return Fidelity(
        o_jct,
        pred_jct,
        abs(pred_jct - o_jct) / o_jct if o_jct > 0 else None,
        o_sla,
        pred_sla,
        abs(pred_sla - o_sla) if o_m else None,
        len(o_j),
        censored,
    )


def replay_seed(seed: int, window: int, k: int) -> int:
    """Replay k of a window: one seed for both versions (the common random numbers)."""
    return zlib.crc32(f"{seed}:{window}:{k}".encode())


class ReplayJudge:
    """Paired replays of recorded windows -> the paired sequential test (see the module
    docstring). One test per (champion, challenger) pair: `reset` starts a new one.
    `fidelity`: the pool fidelity is measured over (shared with the judges of other pairs
    by `learner.replay_gate`; by default the judge's own). `replays`: where the replays run
    (`sim.replay_pool`; by default in the calling thread)."""

    def __init__(
        self,
        cfg: ReplayJudgeConfig,
        base: ScenarioConfig,
        fidelity: FidelityPool | None = None,
        replays: Replays | None = None,
    ) -> None:
        self.cfg = cfg
        self.base = base
        self.replays: Replays = replays if replays is not None else InThread()
        self.test = PairedTest(cfg.rule)
        self.reports: list[WindowReport] = []
        self.fidelity = fidelity if fidelity is not None else FidelityPool(cfg.fidelity_windows)

    def reset(self) -> None:
        """A new pair of versions: the test starts over."""
        self.test = PairedTest(self.cfg.rule)

    def replay(
        self, world: ReplayWorld, policy: PolicyFactory, window: int, n: int | None = None
    ) -> list[ReplayResult]:
        """K replays of one version over `world` (the first `n` of them, when given)."""
        count = self.cfg.replays if n is None else min(n, self.cfg.replays)
        seeds = [replay_seed(self.cfg.seed, window, k) for k in range(count)]
        return play_one(self.replays, world, policy, seeds)

    def judge(
        self,
        obs: ObservedWindow,
        champion: PolicyFactory,
        challenger: PolicyFactory,
        served: PolicyFactory | None = None,
    ) -> WindowReport:
        """Replay `obs` for both versions and update the test. Fidelity is measured on the
        window replayed as it was served: `served` when another version served some of its
        workflows (`learner.replay_gate` maps each to the version that served it), else the
        champion's own replays (`_unversioned`: a window recorded without versions)."""
        world = obs.world(self.base)
        base = self.replay(world, champion, obs.index)
        served = served or _unversioned(obs, champion, challenger)
        as_it_was = (
            self.replay(world, served, obs.index, self.cfg.fidelity_replays)
            if served is not None
            else base
        )
        report = self._with_fidelity(obs, as_it_was, base)
        if report.decision == UNRELIABLE:
            self.reports.append(report)
            return report
        other = self.replay(world, challenger, obs.index)
        report.challenger = [_summary(r) for r in other]
        report.diffs = [paired_diffs(a, b) for a, b in zip(base, other, strict=True)]
        self.test.add_window(report.diffs)
        v = self.test.verdict()
        report.decision, report.reason, report.verdict = v.decision, v.reason, v
        self.reports.append(report)
        return report

    def measure(
        self,
        obs: ObservedWindow,
        champion: PolicyFactory,
        other: PolicyFactory | None = None,
        served: PolicyFactory | None = None,
    ) -> WindowReport:
        """Replay `obs` as it was served, for fidelity only (no test is fed): as `served`
        (each workflow by the version that served it), or by the champion, and by `other`
        on the workflows another version served (`elsewhere`: a window that began before
        the challenger under test came). `MEASURED`, or `UNRELIABLE` while the pooled
        fidelity is off."""
        served = served or _unversioned(obs, champion, other)
        n = self.cfg.fidelity_replays
        got = self.replay(obs.world(self.base), served or champion, obs.index, n)
        report = self._with_fidelity(obs, got, got if served is None else [])
        if report.decision != UNRELIABLE:
            report.decision, report.reason = MEASURED, "fidelity only: no test judges it"
        self.reports.append(report)
        return report

    def _with_fidelity(
        self, obs: ObservedWindow, served: list[ReplayResult], champion: list[ReplayResult]
    ) -> WindowReport:
        """The window's report so far: its fidelity, pooled and its own; `UNRELIABLE` with
        the reason when the pooled fidelity is over the limit, else undecided ("")."""
        fid = self.fidelity.add(obs, served)
        report = WindowReport(obs.index, len(obs.workflows), fid, "", "",
                              champion=[_summary(r) for r in champion],
                              own_fidelity=fidelity_of([(obs, served)]))  # fmt: skip
        if fid.off_by_more_than(self.cfg.fidelity_max_jct_err):
            report.decision = UNRELIABLE
            report.reason = (
                f"replay fidelity: {fid.describe()} (limit {self.cfg.fidelity_max_jct_err:.0%})"
            )
        return report


def _unversioned(
    obs: ObservedWindow, champion: PolicyFactory, other: PolicyFactory | None
) -> PolicyFactory | None:
    """A window recorded without the versions that served it, as served: the champion, and
    `other` on the workflows another version served (`elsewhere`); None when the champion
    served them all, or when the versions are known (`served_by`: the caller maps them)."""
    if obs.served_by or not obs.elsewhere:
        return None
    if other is None:
        raise ValueError("a window another version shared is measured as it was served")
    return as_served(champion, dict.fromkeys(obs.elsewhere, other))


def statistics(report: WindowReport) -> dict[str, Any]:
    """What an audit record keeps of a verdict: the test's statistics and the fidelity."""
    v = report.verdict
    return {
        "judge": "replay",
        "decision": report.decision,
        "reason": report.reason,
        "rule": v.rule if v is not None else "",
        "stats": v.to_dict()["stats"] if v is not None else {},
        "fidelity": asdict(report.fidelity),
        "window": report.window,
        "metrics": list(PAIRED_METRICS),
    }
