"""`dagsched demo`: the whole loop on one machine, shifted midway, ending with a story.

An embedded Tansu broker; one daemon replica serving the champion (the shipped one, registered
in a fresh demo registry) and a `daemon.challenger_share` slice of workflows to the challenger;
the learner making challengers (by default, by searching the heads' shifts on the windows it
recorded); the evaluator judging them (by default, the replay judge with a canary); and the
simulator replaying workflows through Kafka (with `wait_for_loop`, its time standing still
while the learner or the judge works: `TimeStandsStill`). Halfway through the workload (by
arrival time; `shift_share` moves it) the world shifts, unannounced (`sim.shift`: the
settings' shift effects, else `PRODUCTION_SHIFT`): the retry after an OOM kill pays a long
restart (an hour in `PRODUCTION_SHIFT`), which the observation does not show until outcomes
do, and task families start shipping new releases that history has not measured. The
closing story compares the same workload in the simulator under the frozen shipped champion
and `heft_history`.

The demo keeps its registry under `<home>/demo` (wiped at each start) and its topics under a
fresh prefix, so it never touches the user's models. Everything runs in one asyncio loop; the
learner's fine-tuning and registry calls run in worker threads, as they do in the services.
"""

from __future__ import annotations

import asyncio
import math
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import structlog

from dagsched.daemon.broker import embedded_broker
from dagsched.daemon.replay import Replay, ReplayConfig, WorkflowOutcome
from dagsched.daemon.service import Daemon
from dagsched.learner.replay_judge import WindowReport
from dagsched.learner.services import EvaluatorService, LearnerService
from dagsched.policy.bundle import load_bundle
from dagsched.registry.promotion import audit_trail
from dagsched.registry.store import SHIPPED_CHAMPION, Registry
from dagsched.settings import Settings
from dagsched.sim.config import PRODUCTION_SHIFT, ShiftConfig
from dagsched.sim.runner import simulate, stream_workflows
from dagsched.sim.snapshot import SchedulerPolicy

log = structlog.get_logger("dagsched.demo")
MODEL_WAIT_S = 120.0
DRAIN_S = 30.0  # at most this long for the evaluator to judge the last workflows
HOLD_MAX_S = 300.0  # by default, the longest simulated time stands still for one busy spell
Progress = Callable[[int, int], None]


@dataclass
class Story:
    """What happened, for the closing story and `--json`."""

    shift_at_s: float | None  # None: the world did not shift
    shift: dict[str, Any]
    served_by: str
    replay: dict[str, Any]
    outcomes: list[WorkflowOutcome]
    versions: list[dict[str, Any]] = field(default_factory=list)
    verdicts: list[dict[str, Any]] = field(default_factory=list)
    replay_windows: list[dict[str, Any]] = field(default_factory=list)  # the replay judge's
    audit: list[dict[str, Any]] = field(default_factory=list)
    rounds: list[str] = field(default_factory=list)
    searched: list[dict[str, Any]] = field(default_factory=list)  # the learner's head searches
    settings: dict[str, Any] = field(default_factory=dict)

    def sla(self, before: bool | None = None, arm: str | None = None) -> tuple[float, int]:
        """(SLA attainment, workflows) over those that arrived before/after the shift."""
        at = self.shift_at_s if self.shift_at_s is not None else math.inf
        chosen = [
            o
            for o in self.outcomes
            if (before is None or (o.arrival_s < at) == before) and (arm is None or o.arm == arm)
        ]
        return (sum(o.met_deadline for o in chosen) / len(chosen) if chosen else 0.0), len(chosen)

    def to_dict(self) -> dict[str, Any]:
        periods = {"before_shift": True, "after_shift": False, "all": None}
        sla = {
            period: {
                arm or "all": dict(
                    zip(("sla_attainment", "workflows"), self.sla(before, arm), strict=True)
                )
                for arm in (None, "champion", "challenger")
            }
            for period, before in periods.items()
        }
        return {
            "served_by": self.served_by,
            "shift_at_s": self.shift_at_s,
            "shift": self.shift,
            "sla": sla,
            "replay": self.replay,
            "rounds": self.rounds,
            "searched": self.searched,
            "versions": self.versions,
            "verdicts": self.verdicts,
            "replay_windows": self.replay_windows,
            "audit": self.audit,
            "settings": self.settings,
        }


def demo_settings(settings: Settings) -> Settings:
    """A fresh registry under `<home>/demo` and topics under a fresh prefix."""
    home = settings.home / "demo"
    shutil.rmtree(home, ignore_errors=True)
    return settings.model_copy(
        update={
            "home": home,
            "mlflow_tracking_uri": None,
            "topic_prefix": f"demo-{uuid.uuid4().hex[:8]}-",
        }
    )


def arrival_at(settings: Settings, workflows: int, seed: int, share: float = 0.5) -> float:
    """Arrival time (simulated s) of the workflow at `share` of the replayed workload (0.5:
    the middle one)."""
    arrivals = [wf.arrival_s for wf in stream_workflows(settings.sim, seed, workflows)]
    return arrivals[min(len(arrivals) - 1, int(len(arrivals) * share))]


class TimeStandsStill:
    """Simulated time stands still while the learner runs a round or the replay judge has
    windows to replay, as if they took no time. The replay plays the workload as fast as
    the daemon decides, ten times or more faster than real time; the learner and the judge
    would otherwise fall windows behind the traffic they learn from and judge. In real time
    a window of the demo's 25 workflows arrives over about 7 minutes, and its replays take
    well under one. A part that stays busy past `max_s` in one spell ends the holding: the
    demo goes on as fast as the daemon decides (`gave_up`)."""

    def __init__(
        self, learner: LearnerService, evaluator: EvaluatorService, max_s: float = HOLD_MAX_S
    ) -> None:
        self.learner, self.evaluator = learner, evaluator
        self.max_s = max_s
        self.held_s = 0.0  # wall time simulated time stood still
        self.gave_up = False

    async def hold(self) -> None:
        if self.gave_up:
            return
        t0 = time.monotonic()
        while self.learner.busy or self.evaluator.busy:
            if time.monotonic() - t0 > self.max_s:
                self.gave_up = True
                log.warning("demo.hold_given_up", after_s=self.max_s)
                break
            await asyncio.sleep(0.1)  # polling flags of services running in this loop
        self.held_s += time.monotonic() - t0


async def _until(cond: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)  # polling counters of services running in this loop


async def _wait_for_champion(daemon: Daemon, task: asyncio.Task[None]) -> str:
    deadline = time.monotonic() + MODEL_WAIT_S
    while daemon.models.version("champion") is None and time.monotonic() < deadline:
        if task.done():
            await task  # surfaces why the daemon stopped
        await asyncio.sleep(0.2)  # polling a load that runs in a worker thread
    return daemon.models.version("champion") or "fallback (no model loaded)"


async def run_demo(
    settings: Settings,
    workflows: int,
    seed: int = 0,
    shift: bool = True,
    progress: Progress | None = None,
    shift_share: float = 0.5,
    wait_for_loop: bool = False,
    hold_max_s: float = HOLD_MAX_S,
) -> Story:
    """Broker + daemon + learner + evaluator + replay (the shift on at the arrival of the
    workflow at `shift_share` of the workload); returns the story. `wait_for_loop`:
    simulated time stands still while the learner or the judge works (`TimeStandsStill`),
    at most `hold_max_s` a spell; the judge's last windows are waited for as long."""
    s = demo_settings(settings)
    shift_at = arrival_at(s, workflows, seed, shift_share) if shift else None
    shift_cfg = demo_shift(s, shift_at) if shift_at is not None else None
    s = s.model_copy(update={"sim": replace(s.sim, shift=shift_cfg)})
    reg = Registry(s)
    champion = await asyncio.to_thread(reg.ensure_champion)
    log.info("demo.registry", home=str(s.home), champion=champion)
    verdicts: list[dict[str, Any]] = []
    async with embedded_broker(s) as broker:
        s = s.model_copy(update={"kafka_bootstrap": broker.bootstrap})
        log.info("demo.broker", bootstrap=broker.bootstrap)
        stop = asyncio.Event()
        daemon = Daemon(s, metrics_port=0)
        learner = LearnerService(s)
        evaluator = EvaluatorService(s, verdicts.append)
        tasks = {
            "daemon": asyncio.create_task(daemon.async_run()),
            "learner": asyncio.create_task(learner.run(stop)),
            "evaluator": asyncio.create_task(evaluator.run(stop)),
        }
        try:
            served = await _wait_for_champion(daemon, tasks["daemon"])
            log.info("demo.serving", champion=served, shift_at_s=shift_at)
            still = TimeStandsStill(learner, evaluator, hold_max_s)
            replay = Replay(
                s,
                ReplayConfig(workflows=workflows, seed=seed),
                progress,
                hold=still.hold if wait_for_loop else None,
            )
            result = await replay.run()
            # let the evaluator judge the last workflows, and replay the last windows they
            # closed, before everything stops: the story tells every window
            ended = [o for o in replay.workflow_outcomes() if o.end_s is not None]
            judged = sum(o.arm != "fallback" for o in ended)
            await _until(lambda: evaluator.samples >= judged, DRAIN_S)
            await _until(lambda: not evaluator.busy, hold_max_s)
        finally:
            daemon.stop()
            stop.set()
            for name, t in tasks.items():
                try:
                    await asyncio.wait_for(t, 120)
                except Exception as exc:  # one part failing must not hide the others' story
                    log.error("demo.part_failed", part=name, error=repr(exc))
    story = Story(
        shift_at_s=shift_at,
        shift=shift_cfg.__dict__ if shift_cfg else {},
        served_by=served,
        replay={
            **result,
            "daemon_decisions": daemon.stats["decisions"],
            "stale_views": daemon.stats["stale_views"],
            "held_s": still.held_s,
            "hold_given_up": still.gave_up,
        },
        outcomes=replay.workflow_outcomes(),
        verdicts=verdicts,
        replay_windows=replay_windows(evaluator),
        rounds=learner.rounds,
        searched=learner.searched,
        settings={
            "challenger_share": s.daemon.challenger_share,
            "every_n_tasks": s.learner.every_n_tasks,
            "learner": s.learner.method,
            "min_gain": s.learner.search.min_gain,
            "min_samples": s.evaluator.min_samples,
            "judge": s.evaluator.judge,
            "rule": evaluator.judge.rule.describe(),
            "home": str(s.home),
        },
    )
    story.versions, story.audit = await asyncio.to_thread(_registry_story, reg)
    return story


def replay_windows(evaluator: EvaluatorService) -> list[dict[str, Any]]:
    """The replay judge's windows, as the evaluator judged them (or measured them for
    fidelity only, with no challenger), by window."""
    gate = evaluator.gate
    if gate is None:
        return []
    got: list[tuple[str, str | None, WindowReport]] = [
        *((job.champion, job.challenger, r) for job, r in gate.measured),
        *((pair[0], pair[1], r) for pair, r in gate.reports),
    ]
    return [
        {
            "champion": champion,
            "challenger": challenger,
            "window": r.window,
            "decision": r.decision,
            "reason": r.reason,
            "jct_err": r.fidelity.jct_err,
            "jct_gain": float(np.mean([d["jct"] for d in r.diffs])) if r.diffs else None,
        }
        for champion, challenger, r in sorted(got, key=lambda x: x[2].window)
    ]


def _registry_story(reg: Registry) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    aliases: dict[str, list[str]] = {}
    for alias, version in reg.aliases().items():
        aliases.setdefault(version, []).append(alias)
    versions = []
    for mv in reversed(reg.versions()):
        t = mv.tags
        versions.append(
            {
                "version": str(mv.version),
                "aliases": sorted(aliases.get(str(mv.version), [])),
                "origin": t.get("origin", ""),
                "parent": t.get("parent", ""),
                "resumed_from": t.get("resumed_from", ""),
                "kl_to_champion": t.get("metric.losses/kl_to_champion", ""),
                "transitions": t.get("metric.online/transitions", ""),
            }
        )
    audit = [{k: r[k] for k in ("action", "version", "from_version", "reason", "actor", "at")}
             for r in audit_trail(reg)]  # fmt: skip
    return versions, audit


def demo_shift(settings: Settings, at_s: float) -> ShiftConfig:
    """The settings' shift effects (`PRODUCTION_SHIFT` when none is set), from `at_s`."""
    return replace(settings.sim.shift or PRODUCTION_SHIFT, at_s=at_s)


def heuristic_context(
    settings: Settings, workflows: int, shift_at: float | None, seed: int = 0
) -> list[dict[str, Any]]:
    """The same workload (and shift) in the simulator under the frozen shipped champion and
    `heft_history`."""
    shift = demo_shift(settings, shift_at) if shift_at is not None else None
    wl = replace(settings.sim.workload, workflows=workflows)
    sc = replace(settings.sim, workload=wl, shift=shift)
    frozen = SchedulerPolicy(load_bundle(SHIPPED_CHAMPION, "shipped"), "frozen champion")
    return [simulate(sc, p, seed=seed) for p in (frozen, "heft_history")]
