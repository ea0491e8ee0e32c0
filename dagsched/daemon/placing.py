"""Placing a batch of ready tasks: fresh view, one policy call per arm, atomic reservations.

`Placer.decide` is the daemon's decision step. Each round reads the cluster view (waiting,
the first time, until it has caught up with the requests' job-queue time), runs the champion,
challenger or fallback on its slice of the batch, and reserves the round's placements with one
call of the Lua decide script (in planning order): a placement that no longer fits (another
replica got there first) is re-planned on a fresh view, and the last round queues it on the
node. A model that fails or breaks the
contract is replaced by the heuristic for that batch.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict
from collections.abc import Iterable

import numpy as np
import structlog

from dagsched.core.bounds import clamp_placement
from dagsched.core.estimates import advertised_run_s
from dagsched.core.history import FamilySummary
from dagsched.core.scheduler import Placement, Scheduler
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import TASK_TYPE_NAMES, Workflow, downward_finish_s
from dagsched.daemon import encoding
from dagsched.daemon.arms import Models
from dagsched.daemon.call_log import Logged, PolicyCall, Trace, snapshot
from dagsched.daemon.history_store import Declared
from dagsched.daemon.metrics import DaemonMetrics
from dagsched.daemon.redis_state import Reservation
from dagsched.daemon.state_store import Progress, StateStore
from dagsched.schemas.messages import TaskReadyMsg
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

PLACE_ROUNDS = 3
VIEW_POLL_S = 0.002  # how often a batch re-reads the clock while it waits for the updater

Key = tuple[str, int]  # (workflow_id/task, attempt)
# a batch's first-round reads (`Placer.read_inputs`): workflows by id, the view, where the
# modelled tasks' workflows stand, their families' history
Inputs = tuple[
    dict[str, Workflow | None], ClusterView | None, dict[str, Progress], dict[str, FamilySummary]
]


class Hold(Exception):
    """The batch cannot be answered yet (no alive node); retry it without committing."""


class Placer:
    """Decides batches for one daemon replica (its store, models, metrics and counters)."""

    def __init__(
        self,
        settings: Settings,
        store: StateStore,
        models: Models,
        metrics: DaemonMetrics,
        stats: dict[str, int],
    ) -> None:
        self.settings = settings
        self.cfg = settings.daemon
        self.store = store
        self.models = models
        self.metrics = metrics
        self.stats = stats
        self._logs: list[Logged] = []
        self._last_trace: list[Trace] = []
        self._history: dict[str, FamilySummary] = {}
        self._last_view: str | None = None
        # per workflow id: (the Workflow, its downward finish times, their max), across
        # batches while the store keeps that Workflow object
        self._finish: dict[str, tuple[Workflow, list[float], float]] = {}

    async def read_inputs(self, msgs: Iterable[TaskReadyMsg]) -> Inputs:
        """What a batch's first round reads for the tasks `msgs`: their workflows (the local
        cache, else Redis), then in one round trip the cluster view, where the modelled
        tasks' workflows stand and their families' history (the heuristic reads neither).
        `BatchLoop.process` reads this for every ready task of a batch while it looks up
        their stored decisions: the two round trips overlap."""
        msgs = list(msgs)
        wfs = await self.store.workflow_lookup(sorted({m.workflow_id for m in msgs}))
        modelled = [
            (m, wf)
            for m in msgs
            if (wf := wfs.get(m.workflow_id)) is not None
            and m.task < wf.size
            and self._model_arm((f"{m.workflow_id}/{m.task}", m.attempt))
        ]
        view, progress, history = await self.store.round_inputs(
            sorted({m.workflow_id for m, _ in modelled}),
            sorted({wf.tasks[m.task].family for m, wf in modelled}),
        )
        return wfs, view, progress, history

    async def decide(
        self,
        todo: dict[tuple[str, int], TaskReadyMsg],
        fetched: float,
        inputs: Inputs | None = None,
    ) -> tuple[dict[tuple[str, int], bytes | str], set[tuple[str, int]], list[Logged]]:
        """Place every task of `todo`: decisions (or dead-letter reasons, as str) by key, the
        keys whose decision was made now (not found stored by another replica), and the
        decision-log records (one `decision_batch` per policy call with new decisions).
        `inputs`: `read_inputs` of these tasks or more, read just before (else read here)."""
        self._logs = []
        out: dict[tuple[str, int], bytes | str] = {}
        new: set[tuple[str, int]] = set()
        if inputs is None:
            inputs = await self.read_inputs(todo.values())
        wfs, view, progress, self._history = inputs
        pending: dict[tuple[str, int], tuple[TaskReadyMsg, Workflow]] = {}
        for key, m in todo.items():
            wf = wfs.get(m.workflow_id)
            if wf is None:
                out[key] = f"task_ready for unknown workflow {m.workflow_id!r}"
            elif m.task >= wf.size:
                out[key] = (
                    f"task_ready.task {m.task} is out of range: workflow {m.workflow_id!r} "
                    f"has {wf.size} tasks"
                )
            else:
                pending[key] = (m, wf)
        # the view waits for the events a request follows: a task's parent finishing, or
        # its earlier attempt failing, at the same instant (`at`). A new workflow's first
        # tasks follow none; for them the clock only moves on to their time (`now`)
        timed = [(m.at, follows_event(m, wf)) for m, wf in pending.values() if m.at is not None]
        at = max((t for t, follows in timed if follows), default=None)
        now = max((t for t, _ in timed), default=None)
        if self.store.backlog_full(len(pending)):
            raise Hold(
                "Redis is away and the decisions waiting to be written back would pass "
                f"daemon.caches.decisions ({self.cfg.caches.decisions})"
            )
        for round_ in range(PLACE_ROUNDS):
            if not pending:
                break
            ids = sorted({m.workflow_id for k, (m, _) in pending.items() if self._model_arm(k)})
            view, again = await self._fresh_view(at, round_ == 0, view if round_ == 0 else None)
            if view is None or view.n == 0 or not view.alive.any():
                raise Hold("no alive node known")
            if now is not None and view.now < now:
                view.now = now
            if round_ > 0 or again:  # the view was read again: where workflows stand, too
                progress = await self.store.progress(ids)
            last = round_ == PLACE_ROUNDS - 1
            placed = await self._place_round(
                view, pending, progress, fetched, queue_all=last, new=new
            )
            for key, answer in placed.items():
                out[key] = answer
                pending.pop(key, None)
        if pending:
            raise Hold(f"{len(pending)} task(s) could not be placed")
        return out, new, self._logs

    async def _fresh_view(
        self, at: float | None, wait: bool, view: ClusterView | None = None
    ) -> tuple[ClusterView | None, bool]:
        """The cluster view once it has caught up with job-queue time `at` (the newest request
        of the batch): the updater applies events concurrently, and a task's parent finishing
        and the task becoming ready happen at the same instant. After `daemon.view_wait_ms`
        (or at once when not `wait`) the batch is decided on what is known, clock at `at`.
        `view`: one just read (else it is read here). Also says whether it was read again."""
        if view is None:
            view = await self.store.view()
        again = False
        if at is None or view is None:
            return view, again
        if view.now + 1e-6 < at and wait:
            # poll the clock alone (one GET), then read the whole view once it has caught up
            deadline = time.monotonic() + self.cfg.view_wait_ms / 1000
            clock: float | None = view.now
            while clock is not None and clock + 1e-6 < at and time.monotonic() < deadline:
                await asyncio.sleep(VIEW_POLL_S)  # the updater runs meanwhile
                clock = await self.store.clock()
            if clock is not None and clock > view.now:
                view, again = await self.store.view(), True
                if view is None:
                    return None, again
        if view.now + 1e-6 < at:
            if wait:
                self.metrics.stale_views.inc()
                self.stats["stale_views"] += 1  # in the stopped log's counts too
            view.now = at
        return view, again

    async def _place_round(
        self,
        view: ClusterView,
        pending: dict[tuple[str, int], tuple[TaskReadyMsg, Workflow]],
        progress: dict[str, Progress],
        fetched: float,
        queue_all: bool,
        new: set[tuple[str, int]],
    ) -> dict[tuple[str, int], bytes]:
        by_arm: dict[str, list[tuple[str, int]]] = defaultdict(list)
        for key in pending:
            by_arm[self.models.pick(*key)].append(key)
        view = view.batch_copy()  # each arm's placements are taken before the next arm's
        index = {node: i for i, node in enumerate(view.node_ids)}
        placed: dict[tuple[str, int], bytes] = {}
        ready: dict[str, set[int]] = defaultdict(set)  # ready now, as the simulator sees it
        for m, _ in pending.values():
            ready[m.workflow_id].add(m.task)
        planned: list[tuple[tuple[str, int], str, PolicyCall, int]] = []
        reservations: list[tuple[Reservation, bool]] = []
        calls: list[PolicyCall] = []
        masks: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # per workflow, once a round
        for arm, keys in sorted(by_arm.items()):
            model = arm != "fallback"  # the heuristic reads no sub-deadline: not computed
            tvs = [self._task_view(index, *pending[k], progress, ready, masks, model) for k in keys]
            placements, arm, version = self._run_policy(arm, view, tvs)
            now = time.time()
            call = PolicyCall(arm, version, now, self._last_view)
            calls.append(call)
            for key, tv, p, trace in zip(keys, tvs, placements, self._last_trace, strict=True):
                m, wf = pending[key]
                spec = wf.tasks[tv.idx]
                node = int(p.node)
                cpu, mem, retries = clamp_placement(float(p.cpu), float(p.mem), p.max_retries)
                cores, mem_gb = cpu * view.cores[node], mem * view.mem_gb[node]
                fits = view.take(tv, node, cpu, mem)
                decision = encoding.decision(
                    m.workflow_id,
                    m.task,
                    m.attempt,
                    view.node_ids[node],
                    cpu,
                    mem,
                    retries,
                    version,
                    arm,
                    encoding.bounded_log_prob(p.log_prob),
                    now,
                    max(0.0, (time.monotonic() - fetched) * 1000),
                    float(p.priority) if math.isfinite(p.priority) else 0.0,
                )
                speed = float(view.speed[node][spec.type])
                declared = Declared(spec.family, TASK_TYPE_NAMES[spec.type], spec.cpu_cores,
                                    spec.mem_gb, spec.duration_s, spec.cold_start_s)  # fmt: skip
                res = Reservation(
                    task_key=key[0],
                    attempt=key[1],
                    node=view.node_ids[node],
                    cores=float(cores),
                    mem=float(mem_gb),
                    core_s=float(cores * spec.duration_s / max(speed, 1e-9)),
                    decision=decision,
                    fits=fits,
                    declared=declared,
                    advertised_s=advertised_run_s(
                        spec.duration_s, speed, spec.cpu_cores, float(cores)
                    ),
                )
                planned.append((key, arm, call, call.add(m, tv, p, trace)))
                reservations.append((res, queue_all or not fits))
        # the whole round's reservations in one atomic step, in the order they were planned
        results = await self.store.decide_many(reservations)
        by_arm_new: dict[str, int] = defaultdict(int)
        for (key, arm, call, pos), (res, _), (status, winner) in zip(
            planned, reservations, results, strict=True
        ):
            if status in ("r", "q"):
                placed[key] = res.decision
                new.add(key)
                call.new[pos] = True
                by_arm_new[arm] += 1
            elif status == "dup" and winner is not None:
                placed[key] = winner  # another replica answered first: same decision
        for arm, n in by_arm_new.items():  # counted per round, not per decision
            self.metrics.decisions.labels(arm=arm).inc(n)
            self.stats["decisions"] += n
            if arm == "fallback":
                self.metrics.fallback.labels(why="no_model").inc(n)
        self._logs += [r for c in calls if (r := c.record()) is not None]
        return placed

    def _model_arm(self, key: tuple[str, int]) -> bool:
        return self.models.pick(*key) != "fallback"

    def _run_policy(
        self, arm: str, view: ClusterView, tvs: list[TaskView]
    ) -> tuple[list[Placement], str, str]:
        sched: Scheduler = self.models.scheduler(arm)
        self._last_trace = [None] * len(tvs)
        self._last_view = None
        if arm != "fallback":
            try:
                placements = sched.place(view, tvs)
                _check(placements, view, len(tvs))
                self._last_trace = _trace(sched, len(tvs))
                self._last_view = snapshot(sched, view, tvs, sched.version)
                return placements, arm, sched.version
            except Exception as exc:  # the model failed: the heuristic answers this batch
                log.error("model.failed", arm=arm, version=sched.version, error=str(exc))
                self.metrics.fallback.labels(why="model_error").inc()
        fb = self.models.fallback
        return fb.place(view, tvs), "fallback", fb.version

    def _task_view(
        self,
        index: dict[str, int],
        m: TaskReadyMsg,
        wf: Workflow,
        progress: dict[str, Progress],
        ready: dict[str, set[int]],
        masks: dict[str, tuple[np.ndarray, np.ndarray]],
        model: bool,
    ) -> TaskView:
        """The task as the model was trained to see it: active = decided and not done, or
        ready in this batch. The sub-deadline is 0 for the heuristic (not `model`), which
        reads none. A workflow's done and active masks are built once a round (`masks`) and
        shared, read-only, by its tasks: a map stage of 2,000 siblings built them per task,
        2,000 x 2,000 set lookups."""
        _, _, nodes = progress.get(m.workflow_id, (set(), set(), {}))
        if m.workflow_id not in masks:
            masks[m.workflow_id] = _masks(wf.size, progress, ready, m.workflow_id)
        done, active = masks[m.workflow_id]
        sub_deadline_s = 0.0
        if model:
            down, cp = self._downward_finish(wf)
            sub_deadline_s = wf.arrival_s + wf.deadline_s * down[m.task] / cp
        return TaskView(
            workflow=wf,
            idx=m.task,
            attempt=m.attempt,
            done=done,
            active=active,
            parent_nodes=[index.get(nodes.get(p, ""), -1) for p in wf.parents[m.task]],
            prev_node=index.get(nodes.get(m.task, ""), -1) if m.attempt > 0 else -1,
            sub_deadline_s=sub_deadline_s,
            history=self._history.get(wf.tasks[m.task].family),
        )

    def _downward_finish(self, wf: Workflow) -> tuple[list[float], float]:
        """`downward_finish_s(wf)` and its max (1 if 0), kept while `wf` is the same object."""
        hit = self._finish.get(wf.id)
        if hit is None or hit[0] is not wf:
            f = downward_finish_s(wf)
            if len(self._finish) >= self.cfg.caches.workflows:
                self._finish.clear()
            hit = self._finish[wf.id] = (wf, f, max(f) or 1.0)
        return hit[1], hit[2]


def _trace(sched: Scheduler, n: int) -> list[Trace]:
    """The unit action and value behind each placement of a model's batch."""
    obs = getattr(sched, "last_observations", None)
    units = getattr(sched, "last_units", None)
    values = getattr(sched, "last_values", None)
    if obs is None or units is None or values is None or len(obs) != n:
        return [None] * n
    # Python floats: a float32 would be logged at its own precision, not the model's value
    return [([float(x) for x in u], float(v)) for u, v in zip(units, values, strict=True)]


def _check(placements: list[Placement], view: ClusterView, n: int) -> None:
    if len(placements) != n:
        raise ValueError(f"{len(placements)} placements for {n} tasks")
    for p in placements:
        if not (0 <= p.node < view.n) or not view.alive[p.node]:
            raise ValueError(f"placement on dead or unknown node {p.node}")
        if not (math.isfinite(p.cpu) and math.isfinite(p.mem) and math.isfinite(p.max_retries)):
            raise ValueError(f"placement with a number that is not finite: {p}")


def _masks(
    size: int, progress: dict[str, Progress], ready: dict[str, set[int]], wf_id: str
) -> tuple[np.ndarray, np.ndarray]:
    """A workflow's (done, active) task masks, read-only: active = decided and not done, or
    ready in this batch."""
    done_set, active_set, _ = progress.get(wf_id, (set(), set(), {}))
    done = np.zeros(size, dtype=bool)
    done[[i for i in done_set if i < size]] = True
    active = np.zeros(size, dtype=bool)
    active[[i for i in active_set | ready[wf_id] if i < size]] = True
    done.flags.writeable = False
    active.flags.writeable = False
    return done, active


def follows_event(m: TaskReadyMsg, wf: Workflow) -> bool:
    """Whether the request `m` follows an event at its instant that the view should have
    applied: its task has parents (the last of them finished then) or it is a retry (its
    earlier attempt failed, or its node went down, then)."""
    return m.attempt > 0 or bool(wf.parents[m.task])
