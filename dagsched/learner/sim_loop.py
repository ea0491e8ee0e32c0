"""The online-learning loop played inside the simulator (no Kafka, Redis or MLflow).

`SimLoop` is a simulator `Policy` that serves like the daemon and learns like the services:

- **Serving.** Workflows are split by `workflow_bucket(id) < share` between the champion and,
  when there is one, the challenger (the daemon's split, `dagsched.schemas.ab`, picked per
  task, so a workflow's later tasks go to a challenger that appears mid-way); both serve
  deterministically from one cluster view per batch, as the daemon does.
- **Learner.** Every attempt's outcome (the simulator's own reward) is joined with what decided
  it (raw observation, unit action, log-prob clipped at 0 as on the wire, node index, arm,
  version) into a `Joined`; every `every_n` completed attempts, `finetune_heads` runs on the
  replay window, starting from the current challenger when its parent is the current champion,
  else from the champion (the KL limit is to the champion), and the result becomes the
  challenger. As in the services, a due round waits while a challenger is under test, unless
  `replace_challenger` (then every round replaces it and restarts the test) or
  `keep_learning` (then it improves a shadow, which explores, and the latest
  shadow is the next challenger when the test ends). With `learner: search` a due round
  under test looks at the windows closed since the challenger came
  (`search.supersede`), and a move that beats it there replaces it.
- **Evaluator.** One `Sample` per finished workflow (SLA met, mean reward, speed, arm and version
  of its first decided task, the covariates of that task's batch view) goes to a `Judge`;
  promote makes the challenger champion (the old one becomes previous), retire drops the
  challenger, rollback restores the previous champion. With `evaluator.judge: replay` (the
  services' default) the judge is the evaluator's: a `ReplayGate` over a `SimFeed` records
  the run as the events would tell it, each closed window is replayed for the pair under
  test (blocking the run: replays take no simulated time), and a replay win promotes once
  the live `Judge`, then a canary guardrail, is clean. Build the run with `simulator`, so
  that its arrivals are recorded.

What differs from the services: versions live in a dict instead of MLflow, alias moves take
effect at the next batch without a notice or reload, a round's fine-tuning takes no simulated
time (the real learner takes tens of wall seconds while the champion serves on), outcomes come
straight from the simulator (no join timeouts, no lost messages), and a workflow's SLA is the
simulator's truth (failed only after its last allowed retry). The learning and testing cores,
`finetune_heads` and `Judge`, are the ones the services run.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dagsched.core.workflow import Workflow
from dagsched.learner.adjustment import Congestion, congestion, covariates
from dagsched.learner.canary import CanaryRule
from dagsched.learner.head_search import WindowSearch
from dagsched.learner.joining import Joined
from dagsched.learner.live_ab import Judge, Sample, rule_from, workflow_speed
from dagsched.learner.online import FinetuneConfig, finetune_heads, learning_window
from dagsched.learner.replay_feed import SimFeed
from dagsched.learner.replay_gate import ReplayGate, replay_verdict
from dagsched.learner.replay_judge import config_from
from dagsched.policy.model import ActorCritic
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.ab import slice_arm, workflow_bucket
from dagsched.service_config import EvaluatorSettings, HeadSearchSettings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import cluster_view, task_view

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from dagsched.sim.engine import Simulator


@dataclass(frozen=True)
class LoopConfig:
    """The loop's knobs; `learn=False` is the champion alone (no learner, no evaluator)."""

    learn: bool = True
    share: float = 0.1  # challenger share of workflows (daemon.challenger_share)
    every_n: int = 1000  # completed attempts per round (learner.every_n_tasks)
    window: int = 5000  # replay window (learner.window)
    replace_challenger: bool = False  # learner.replace_challenger
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    # how a round fine-tunes the heads: "search" by paired replay of the newest recorded
    # windows (`search`; needs the replay judge, whose recorder holds them), or "ppo" on the
    # window's attempts (`finetune`); learner.method in the services
    learner: str = "search"
    search: HeadSearchSettings = field(default_factory=HeadSearchSettings)
    evaluator: EvaluatorSettings = field(default_factory=EvaluatorSettings)
    # share of workflows (the buckets after the challenger's) served by the challenger, or
    # the champion while there is none, with sampled actions: the learner's exploration. Not
    # judged; when > 0 the learner fine-tunes on these workflows' attempts only
    explore_share: float = 0.0
    # share of workflows (the buckets after the exploration slice's) the old champion serves
    # while the guardrail watches the one the evaluator promoted (daemon.holdback_share)
    holdback_share: float = 0.0
    # learner.keep_learning in the services (docs/concepts/learning.md): while a
    # challenger is under test, due rounds go on improving a shadow of the champion, which
    # serves the exploration slice (so what the learner learns from stays on-policy); when
    # the test ends, the latest shadow becomes the next challenger at once
    keep_learning: bool = False
    # with keep_learning: rounds chained on the shadow before the first challenger of each
    # champion is tested. A one-round challenger is barely different from its champion,
    # and its test holds the judge for most of a run (docs/concepts/learning.md);
    # learner.min_rounds in the services
    min_rounds: int = 1


@dataclass
class WorkflowResult:
    """One arrived workflow: `end_s` is None while it is still in flight."""

    workflow_id: str
    arrival_s: float
    due_s: float  # arrival + deadline
    arm: str
    version: str
    end_s: float | None = None
    met: bool = False
    failed: bool = False


@dataclass
class LoopEvent:
    """A round registered, a verdict (with its statistics), at simulated time `at_s`."""

    at_s: float
    kind: str  # "round" | "promote" | "retire" | "rollback" | "clear" | "challenger"
    version: str
    champion: str  # the champion after the event
    detail: dict[str, Any] = field(default_factory=dict)


class SimLoop:
    """Champion + challenger serving, learner and evaluator over one simulator run."""

    name = "sim-loop"

    def __init__(self, champion: GNNScheduler, cfg: LoopConfig, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
        self.versions: dict[str, GNNScheduler] = {champion.version: champion}
        self.parent: dict[str, str | None] = {champion.version: None}
        self.champion = champion.version
        self.challenger: str | None = None
        self.shadow: str | None = None  # keep_learning: the learner's latest, not under test
        self.previous: str | None = None
        self.holdback: str | None = None  # the old champion, while the guardrail watches
        self.window: deque[Joined] = deque(maxlen=cfg.window)
        self.completed = 0
        ev = cfg.evaluator
        canary = None
        if cfg.learn and ev.judge == "replay":
            c = ev.canary
            canary = CanaryRule(c.min_workflows, {"sla": c.margin_sla, "speed": c.margin_speed})
        self.judge = Judge(rule_from(ev), ev.guardrail_window, canary)
        self.judge.versions(self.champion, None)
        self.gate: ReplayGate[SimFeed] | None = None  # the replay judge, once `simulator` built
        self.windows: list[dict[str, Any]] = []  # every judged window, as the evaluator logs it
        self.workflows: dict[str, WorkflowResult] = {}
        self.events: list[LoopEvent] = []
        self.samples: list[Sample] = []  # one per finished workflow, as the judge sees it
        # decided attempts: reward, outcome and end time are filled in when they end
        self._decided: dict[tuple[str, int, int], Joined] = {}
        self._rewards: dict[str, list[float]] = {}
        self._congestion: dict[str, Congestion] = {}  # where each workflow's first task met
        self.sim: Simulator | None = None
        self._explorers: dict[str, GNNScheduler] = {}
        self._chain = 0  # rounds since the champion last changed
        self.searches = WindowSearch(cfg.search, seed)  # learner "search"

    # -- driving ------------------------------------------------------------------------------

    def simulator(
        self, scenario: ScenarioConfig, workflows: Iterable[Workflow], seed: int
    ) -> Simulator:
        """The run to play; with the replay judge, its arrivals are recorded as they come."""
        from dagsched.sim.engine import Simulator

        if self.judge.canary_rule is None:
            return Simulator(scenario, workflows, seed=seed)
        gate = ReplayGate(
            config_from(self.cfg.evaluator.replay),
            scenario,
            lambda v: self.versions[f"v{v}"],
            SimFeed,
        )
        gate.versions(self.champion, self.challenger)  # one proposed already: from the start
        sim = Simulator(scenario, gate.feed.workflows(workflows), seed=seed)
        gate.feed.attach(sim)
        self.gate = gate
        self.searches.replays = gate.replays
        return sim

    def run(
        self,
        sim: Simulator,
        until: float | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> list[WorkflowResult]:
        """Play `sim` to its end (or simulated time `until`); every arrived workflow's result.
        `progress(n)` is called as the count `n` of ended workflows grows."""
        if self.judge.canary_rule is not None and (
            self.gate is None or self.gate.feed.sim is not sim
        ):
            raise ValueError("the replay judge records the run: build it with SimLoop.simulator")
        self.sim = sim
        sim.on_outcome = self._on_outcome
        ended = 0
        while (batch := sim.advance(until)) is not None:
            sim.apply(self.decide(sim, batch), batch)
            if progress is not None and (n := len(self.samples)) != ended:
                ended = n
                progress(n)
            due = self.cfg.learn and self.completed >= self.cfg.every_n and self.window
            early = self.cfg.keep_learning and self._chain + 1 < self.cfg.min_rounds
            if due and (self.challenger is None or self.cfg.replace_challenger) and not early:
                self._round(sim.now)
            elif due and self.cfg.keep_learning:
                self._round(sim.now, shadow=True)
            elif due and self.cfg.learner == "search" and self.cfg.search.supersede:
                self._supersede_round(sim.now)
        if progress is not None and len(self.samples) != ended:  # ends after the last decision
            progress(len(self.samples))
        if self.gate is not None:  # the replays' workers, if any; a later `run` starts others
            self.gate.close()
        for run in sim.active.values():  # in flight at the end: arm and version of first task
            wf = run.wf
            if wf.id not in self.workflows:
                self.workflows[wf.id] = WorkflowResult(
                    wf.id, wf.arrival_s, wf.arrival_s + wf.deadline_s, "", ""
                )
        return sorted(self.workflows.values(), key=lambda w: w.arrival_s)

    def arm_of(self, workflow_id: str) -> str:
        """The arm serving a task of this workflow now (the daemon's `Models.pick`)."""
        c = self.cfg
        return slice_arm(
            workflow_bucket(workflow_id),
            c.share,
            c.explore_share,
            c.holdback_share,
            challenger=self.challenger is not None,
            holdback=self.holdback is not None,
        )

    def _server(self, arm: str) -> tuple[str, GNNScheduler]:
        """The version serving `arm`, and its scheduler (sampling, for the explore arm)."""
        if arm == "explore" and self.shadow is not None:
            version = self.shadow
        elif arm == "champion" or (arm == "explore" and self.challenger is None):
            version = self.champion
        elif arm == "holdback":
            assert self.holdback is not None
            version = self.holdback
        else:
            assert self.challenger is not None
            version = self.challenger
        sched = self.versions[version]
        if arm != "explore":
            return version, sched
        if version not in self._explorers:
            self._explorers[version] = GNNScheduler(
                sched.model, sched.normalizer, version, deterministic=False
            )
        return version, self._explorers[version]

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        view = cluster_view(sim).batch_copy()  # each arm sees the earlier arms' placements
        # the snapshot's congestion: the covariates of the workflows this batch starts
        starts = any(t.run.wf.id not in self.workflows for t in ready)
        seen = congestion(view) if starts else None
        arms: dict[str, list[int]] = {}
        for i, t in enumerate(ready):
            arms.setdefault(self.arm_of(t.run.wf.id), []).append(i)
        out: list[Decision | None] = [None] * len(ready)
        for arm, idx in arms.items():
            version, sched = self._server(arm)
            tvs = [task_view(ready[i], sim) for i in idx]
            placements = sched.place(view, tvs)
            for k, (i, p) in enumerate(zip(idx, placements, strict=True)):
                view.take(tvs[k], p.node, p.cpu, p.mem)
                t = ready[i]
                wf = t.run.wf
                if wf.id not in self.workflows:
                    self.workflows[wf.id] = WorkflowResult(
                        wf.id, wf.arrival_s, wf.arrival_s + wf.deadline_s, arm, version
                    )
                    if seen is not None:  # always, as the batch starts this workflow
                        self._congestion[wf.id] = seen
                joined = Joined(
                    key=(t.key, t.attempt),
                    workflow_id=wf.id,
                    arm=arm,
                    version=version,
                    reward=0.0,
                    failed=False,
                    on_time=False,
                    end_at=0.0,
                    max_retries=p.max_retries,
                    observation=sched.last_observations[k],
                    node_index=p.node,
                    unit=sched.last_units[k],
                    log_prob=min(0.0, p.log_prob) if math.isfinite(p.log_prob) else 0.0,
                )
                self._decided[(wf.id, t.idx, t.attempt)] = joined
                out[i] = Decision(t, p.node, p.cpu, p.mem, p.max_retries, p.priority)
        return [d for d in out if d is not None]

    # -- outcomes: the learner's window and the evaluator's samples -----------------------------

    def _on_outcome(self, t: TaskRun, o: TaskOutcome, reward: float) -> None:
        assert self.sim is not None
        now = self.sim.now
        wf = t.run.wf
        if self.gate is not None:
            self.gate.feed.outcome(t, o, now)
        j = self._decided.pop((wf.id, t.idx, t.attempt), None)
        if j is None:
            return
        j.reward, j.failed, j.end_at = reward, o.failed, now
        j.on_time = not o.failed and o.lateness <= 0.0
        self.completed += 1
        self.window.append(j)
        self._rewards.setdefault(wf.id, []).append(reward)
        # the simulator fails a workflow once a task has failed more than max_retries times
        wf_failed = o.failed and t.failures + 1 > t.max_retries
        if not (wf_failed or (not o.failed and t.run.remaining == 1)):
            return
        res = self.workflows[wf.id]
        res.end_s, res.failed = now, wf_failed
        res.met = not wf_failed and now <= res.due_s + 1e-9
        rewards = self._rewards.pop(wf.id)
        for other in t.run.tasks:  # cancelled attempts never report
            self._decided.pop((wf.id, other.idx, other.attempt), None)
        speed = workflow_speed(now - res.arrival_s, res.due_s - res.arrival_s, wf_failed)
        sample = Sample(
            wf.id,
            res.arm,
            res.version,
            float(res.met),
            sum(rewards) / len(rewards),
            speed,
            covariates(wf, self._congestion.pop(wf.id, None)),
        )
        self.samples.append(sample)
        if self.gate is not None:
            self.gate.feed.workflow_ended(
                wf, now, wf_failed, served=res.arm == "champion", version=res.version
            )
        if self.cfg.learn and res.arm != "explore":
            action = self.judge.add(sample)
            if action is not None:
                self.act(now, *action)
        if self.gate is not None:
            self._replay_step(now)

    def _replay_step(self, now: float) -> None:
        """Judge every window closed for the pair under test (measure the others' fidelity),
        and act as the evaluator does: retire on the replay's word, promote on its win once
        the canary is clean."""
        gate = self.gate
        assert gate is not None
        gate.versions(self.champion, self.challenger)
        while (nxt := gate.next_window()) is not None:
            obs, job, judge = nxt
            report = gate.judge_window(obs, job, judge)
            f = report.fidelity
            self.windows.append({
                "at_s": now, "champion": job.champion, "challenger": job.challenger,
                "window": report.window,
                "decision": report.decision, "reason": report.reason,
                "jct_err": f.jct_err, "sla_err": f.sla_err,
                "observed_jct_s": f.observed_jct_s, "predicted_jct_s": f.predicted_jct_s,
                "own_jct_err": report.own_fidelity.jct_err if report.own_fidelity else None,
                "gain": report.gain,
            })  # fmt: skip
            if gate.take(report, job) == "retire":
                self.act(now, "retire", replay_verdict(report))
                return
        verdict = gate.promotion(self.judge.canary)
        if verdict is not None:
            self.act(now, "promote", verdict)

    def act(self, now: float, action: str, verdict: Any) -> None:
        """Apply an evaluator verdict ("promote", "retire", "rollback", "clear") at simulated
        `now`."""
        detail = verdict.to_dict()
        version = self.challenger or ""
        if action == "promote" and self.challenger is not None:
            self.previous, self.champion = self.champion, self.challenger
            self.holdback = self.previous if self.cfg.holdback_share > 0 else None
            self._chain = 0
            self.judge.promoted()
            self.challenger = None
        elif action == "retire":
            self.challenger = None
        elif action == "rollback":
            version = self.champion
            self.holdback = None
            if self.previous is None:
                detail["error"] = "no previous champion to roll back to"
            else:
                self.champion, self.previous = self.previous, None
        elif action == "clear":
            version, self.holdback = self.champion, None
            self.events.append(LoopEvent(now, action, version, self.champion, detail))
            return
        self.judge.versions(self.champion, self.challenger, holdback=self.holdback)
        self.events.append(LoopEvent(now, action, version, self.champion, detail))
        if self.shadow is not None and self.challenger is None and action != "rollback":
            # keep_learning: the test is over; the latest shadow is tested next
            shadow, self.shadow = self.shadow, None
            self.parent[shadow] = self.champion
            self.challenger = shadow
            self.judge.versions(self.champion, shadow)
            self.events.append(LoopEvent(now, "challenger", shadow, self.champion, {}))

    def promote_by_hand(
        self, sched: GNNScheduler, now: float, by: str = "hand", holdback: bool = False
    ) -> str:
        """`dagsched models promote` in the simulator: `sched` becomes a new version and the
        champion at once, the old champion `previous`; the judge's guardrail watches it, as
        the evaluator does when the champion alias moves with the old one as `@previous`.
        By hand no holdback is kept; `holdback` keeps one as the evaluator's promotions do
        (with `holdback_share` above 0)."""
        version = f"v{len(self.versions) + 1}"
        self.versions[version] = GNNScheduler(sched.model, sched.normalizer, version)
        self.parent[version] = self.champion
        self.previous, self.champion = self.champion, version
        self.holdback = self.previous if holdback and self.cfg.holdback_share > 0 else None
        self._chain = 0
        self.judge.versions(self.champion, self.challenger, self.previous, self.holdback)
        self.events.append(LoopEvent(now, "promote", version, self.champion, {"by": by}))
        return version

    def propose(self, model: ActorCritic, now: float, by: str = "hand") -> str:
        """A challenger of the champion from outside the learner (an operator's, or a test's):
        a new version, under test at once, in place of any challenger."""
        self._new_version(now, model, None, False, 0, {"by": by})
        return self.challenger or ""

    # -- the learner's round ------------------------------------------------------------------

    def _round(self, now: float, shadow: bool = False) -> None:
        """Fine-tune a new version: the challenger (replacing one under test only with
        `replace_challenger`), or with `shadow` the learner's next shadow (`keep_learning`)."""
        chall = self.shadow or self.challenger
        base = chall if chall is not None and self.parent[chall] == self.champion else None
        champion = self.versions[self.champion]
        if self.cfg.learner == "search":  # no shadow: it searches from the champion
            if not shadow:
                self._search_round(now, champion)
            return
        window = learning_window(self.window, self.cfg.explore_share > 0)
        result = finetune_heads(
            champion.model,
            champion.normalizer,
            window,
            self.cfg.finetune,
            seed=self.seed + len(self.versions),
            start=self.versions[base].model if base is not None else None,
        )
        self._new_version(now, result.model, base, shadow, len(window), result.metrics)

    def _search_round(self, now: float, champion: GNNScheduler) -> None:
        """A round by paired replay: the champion's heads' shifts searched on the newest
        recorded windows. Nothing to search on yet, or searched on these windows already for
        this champion: wait for the next window. A search that moves nothing makes no
        version."""
        self.completed = 0
        if self.gate is None:
            return
        windows = list(self.gate.recent)
        res = self.searches.run(self.champion, champion, windows, self.gate.base)
        if res is None:
            return
        detail = {"windows": [w.index for w in windows], **res.metrics()}
        if not res.moved:
            self.events.append(LoopEvent(now, "search", "", self.champion, detail))
            return
        self._new_version(now, res.model, None, False, 0, detail)

    def _supersede_round(self, now: float) -> None:
        """A due round while a challenger is under test (`learner.search.supersede`): the
        windows closed since it was registered are searched, and a move that beats it there
        becomes the challenger in its place."""
        self.completed = 0
        gate, rival = self.gate, self.challenger
        if gate is None or rival is None:
            return
        windows = [w for w in gate.recent if w.index >= gate.fresh_from]
        found = self.searches.supersede(
            self.versions[self.champion], self.versions[rival], windows, gate.base
        )
        if found is None:
            return
        detail = {"windows": [w.index for w in windows], "superseded": rival, **found.metrics()}
        self._new_version(now, found.result.model, None, False, 0, detail)

    def _new_version(
        self,
        now: float,
        model: ActorCritic,
        base: str | None,
        shadow: bool,
        transitions: int,
        metrics: dict[str, Any],
    ) -> None:
        """Register a round's model as the next version: the challenger, or the shadow."""
        champion = self.versions[self.champion]
        version = f"v{len(self.versions) + 1}"
        self._chain = self._chain + 1 if base is not None else 1
        self.versions[version] = GNNScheduler(model, champion.normalizer, version)
        self.parent[version] = self.champion
        self.completed = 0
        if shadow:
            self.shadow = version
        else:
            self.challenger, self.shadow = version, None
            self.judge.versions(self.champion, version)
            if self.gate is not None:  # judged on the windows that start from now on
                self.gate.versions(self.champion, version)
        detail = {"from": base or self.champion, "transitions": transitions, **metrics}
        if shadow:
            detail["shadow"] = True
        self.events.append(LoopEvent(now, "round", version, self.champion, detail))
