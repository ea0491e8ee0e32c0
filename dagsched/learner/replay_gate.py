"""The replay judge on served traffic: what it records, the windows it judges for the
(champion, challenger) pair under test, and a replay win waiting for a clean canary.

Kafka-free and synchronous. The evaluator builds it `on_wire` and feeds it decoded messages
and finished workflows; the in-process loop (`learner.sim_loop`) builds it with a `SimFeed`
over its simulator run. Either takes closed windows from `next_window`, runs `judge_window`
(the evaluator in a worker thread: a window's replays take seconds to minutes) and hands the
report back to `take`. Each pair gets its own `ReplayJudge`, so a report judged for a pair
that has since changed is dropped, never counted in the new pair's test. Fidelity is pooled
across pairs (`FidelityPool`): it is the replay's, whichever pair a window was judged for.

A closed window no pair is judged on is replayed as it was served, for fidelity only
(`next_window` gives it as a `Job` that is not `judged`, `judge_window` measures it): one
the champion served alone, one that began before the challenger under test came (its
workflows that another version served are played by that challenger), or one after a
promotion that the old champion shared (each workflow played by the version that served
it). The fidelity is known before a challenger comes, and a new challenger's first windows
are pooled with the windows before them instead of measured alone.

A pair is judged only on fresh windows: those whose every workflow arrived after the pair
was set. A challenger is fitted to the traffic it was trained or searched on, so replaying it
on that traffic confirms what it was fitted to (a search that kept the best of 16 candidates
on two windows wins those windows by construction); traffic that arrived later is a test it
has not seen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

from dagsched.core.history import FamilyStats
from dagsched.core.scheduler import Scheduler
from dagsched.learner.canary import CanaryCheck
from dagsched.learner.joining import Joined
from dagsched.learner.live_ab import Sample, WorkflowOutcomes
from dagsched.learner.replay_feed import MessageFeed
from dagsched.learner.replay_judge import (
    FidelityPool,
    ObservedWindow,
    ReplayJudge,
    ReplayJudgeConfig,
    TrafficRecorder,
    WindowReport,
    config_from,
)
from dagsched.learner.sequential import Verdict
from dagsched.schemas.messages import DecisionBatchMsg, DecisionLogMsg
from dagsched.settings import Settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.replay_pool import replays_for
from dagsched.sim.replay_world import PolicyFactory, as_served
from dagsched.sim.snapshot import PolicyOf

Pair = tuple[str, str]  # (champion, challenger) version ids, "v3"


def record_end(recorder: TrafficRecorder, sample: Sample) -> None:
    """A finished (or failed) workflow's sample, as its window's recorder keeps it (with
    the model version that served it; the fallback heuristic is none)."""
    version = sample.version if sample.arm != "fallback" else None
    recorder.ended(sample.workflow_id, sample.jct_s, sample.sla >= 1.0, sample.serving, version)


class Recording:
    """Consumed messages -> a recorder's windows: the one path from what the evaluator reads
    to what the replay judge replays. Every message goes to the feed; each workflow's end,
    as the evaluator finds it (`WorkflowOutcomes` over the joined attempts: its last task
    finished, or a task out of retries), goes to its window whoever served it. The
    evaluator, the learner's search and `models compare --recorded` read traffic through
    one. Without a feed it only makes the samples (the evaluator with `judge: ab`)."""

    def __init__(self, outcomes: WorkflowOutcomes, feed: MessageFeed | None) -> None:
        self.outcomes = outcomes
        self.feed = feed

    def take(self, msgs: Iterable[Any], joined: Iterable[Joined]) -> list[Sample]:
        """Decoded messages, and the attempts the joiner joined from them -> the samples of
        the workflows they ended."""
        for m in msgs:
            if isinstance(m, DecisionBatchMsg):
                self.outcomes.note(m)  # the covariates of the workflows it placed first
            elif self.feed is not None and not isinstance(m, DecisionLogMsg):
                self.feed.add(m)
        samples = []
        for j in joined:
            sample = self.outcomes.add(j)
            if sample is not None:
                if self.feed is not None:
                    record_end(self.feed.recorder, sample)
                samples.append(sample)
        return samples


class Job(NamedTuple):
    """What a closed window is replayed for: judged for the pair under test, or measured
    for fidelity only (as served: by the champion, and by `challenger` on its slice)."""

    champion: str
    challenger: str | None
    judged: bool = True


# closed windows waiting to be judged: when judging falls behind traffic, the newest are kept
MAX_WAITING = 2


class Feed(Protocol):
    """Where the recorded traffic comes from: it fills the gate's recorder, and knows the
    per-family history now."""

    def families(self) -> dict[str, FamilyStats]: ...


F = TypeVar("F", bound=Feed)


class ReplayGate(Generic[F]):
    """Recorded traffic -> paired replays of the pair under test -> a verdict to act on."""

    def __init__(
        self,
        cfg: ReplayJudgeConfig,
        base: ScenarioConfig,
        load: Callable[[str], Scheduler],
        feed: Callable[[TrafficRecorder], F],
    ) -> None:
        """`load(version)` (a registry version number, "3") gives that version's scheduler;
        `feed(recorder)` the feed that fills the gate's recorder."""
        self.cfg = cfg
        self.base = base
        self.recorder = TrafficRecorder.of(cfg)
        self.feed = feed(self.recorder)
        self.load = load
        self.pair: Pair | None = None
        self.champion: str | None = None
        self.fidelity = FidelityPool(cfg.fidelity_windows)  # every pair's, and none's
        self.replays = replays_for(cfg.workers)  # every pair's judge's, and a search's
        self.judge = ReplayJudge(cfg, base, self.fidelity, self.replays)
        self.won: WindowReport | None = None  # the pair's replay win, waiting for the canary
        self.waiting: deque[ObservedWindow] = deque(maxlen=MAX_WAITING)
        # closed windows no pair is judged on, to measure: fidelity only
        self.unjudged: deque[tuple[ObservedWindow, Job]] = deque(maxlen=MAX_WAITING)
        self.recent: deque[ObservedWindow] = deque(maxlen=MAX_WAITING)  # whatever the pair
        self.reports: deque[tuple[Pair, WindowReport]] = deque(maxlen=1000)
        # the windows replayed for fidelity only, with what they were replayed as
        self.measured: deque[tuple[Job, WindowReport]] = deque(maxlen=1000)
        self.skipped = 0  # closed windows not judged: no pair, not fresh, or judging fell behind
        self.fresh_from = 0  # the first window the pair under test may be judged on
        self._factories: dict[str, PolicyFactory] = {}  # version -> its loaded scheduler's

    @staticmethod
    def on_wire(settings: Settings, load: Callable[[str], Scheduler]) -> ReplayGate[MessageFeed]:
        """The evaluator's gate: fed with the messages it consumes (`feed.add`)."""
        return ReplayGate(
            config_from(settings.evaluator.replay),
            settings.sim,
            load,
            lambda rec: MessageFeed(rec, settings.daemon.max_dag_tasks, settings.sim.cluster.speed),
        )

    # -- feeding ------------------------------------------------------------------------------

    def ended(self, sample: Sample) -> None:
        """A workflow finished (or failed): what its window really did."""
        record_end(self.recorder, sample)

    def versions(self, champion: str | None, challenger: str | None) -> None:
        """The pair under test now; a new pair starts a new test."""
        self.champion = champion
        pair = (champion, challenger) if champion and challenger else None
        if pair == self.pair:
            return
        self.pair = pair
        self.judge = ReplayJudge(self.cfg, self.base, self.fidelity, self.replays)
        self.won = None
        # judged on traffic still to come: the first window that starts after this arrival
        self.fresh_from = -(-self.recorder.arrivals // self.cfg.window_workflows)
        self.waiting = deque(maxlen=MAX_WAITING)
        keep = {*(pair or ()), champion}
        self._factories = {v: f for v, f in self._factories.items() if v in keep}

    # -- judging ------------------------------------------------------------------------------

    def next_window(self) -> tuple[ObservedWindow, Job, ReplayJudge] | None:
        """The next closed window to replay, if any: judged for the pair under test, else
        measured for fidelity only. Judging comes first. A window no pair is judged on is
        measured as it was served: each workflow by the version that served it, where the
        recording knows them all (the windows after a promotion, which the old champion or
        the new one's slice shared), else by the champion and, while a pair is under test,
        by its challenger on the workflows another version served."""
        closed = self.recorder.ready(self.feed.families()) if self.recorder.closable() else []
        for w in closed:
            self.recent.append(w)
            if self.pair is None or w.index < self.fresh_from:
                self.skipped += 1
                if self.pair is not None:
                    self.unjudged.append((w, Job(*self.pair, judged=False)))
                elif self.champion is not None and w.elsewhere <= w.served_by.keys():
                    self.unjudged.append((w, Job(self.champion, None, judged=False)))
                continue
            if len(self.waiting) == self.waiting.maxlen:
                self.skipped += 1
            self.waiting.append(w)
        if self.pair is not None and self.waiting:
            return self.waiting.popleft(), Job(*self.pair), self.judge
        if self.unjudged:
            w, job = self.unjudged.popleft()
            return w, job, self.judge
        return None

    def judge_window(self, obs: ObservedWindow, job: Job, judge: ReplayJudge) -> WindowReport:
        """Replay `obs` for both versions of `job`'s pair, or as served for fidelity only
        when `job` is not judged (blocking: run it in a worker thread)."""
        champion = self._policy(job.champion)
        other = self._policy(job.challenger) if job.challenger is not None else None
        served = self._as_served(obs, job.champion)
        if not job.judged:
            return judge.measure(obs, champion, other, served)
        assert other is not None
        return judge.judge(obs, champion, other, served)

    def _as_served(self, obs: ObservedWindow, champion: str) -> PolicyFactory | None:
        """`obs`'s traffic as it was served, when a version other than `champion` served
        some of it (a challenger's slice, or the champion before a promotion): each of its
        workflows by the version that served it. None when `champion` served it all."""
        others = {i: v for i, v in obs.served_by.items() if v != champion}
        if not others:
            return None
        return as_served(self._policy(champion), {i: self._policy(v) for i, v in others.items()})

    def take(self, report: WindowReport, job: Job) -> str | None:
        """A judged window's report: "retire" when the replay says so, None otherwise (a win
        is kept in `won` until the canary is clean). Reports of an old pair are dropped;
        those of windows measured for fidelity only are kept in `measured`."""
        if not job.judged:
            self.measured.append((job, report))
            return None
        if self.pair is None or (job.champion, job.challenger) != self.pair:
            return None
        self.reports.append((self.pair, report))
        if report.decision == "retire":
            return "retire"
        if report.decision == "promote":
            self.won = report
        return None

    def promotion(self, canary: CanaryCheck | None) -> Verdict | None:
        """The verdict to promote on: the pair's replay win once its canary is clean (one
        try per win: a promotion refused waits for the next win)."""
        if self.won is None or canary is None or canary.status != "clean":
            return None
        report, self.won = self.won, None
        return replay_verdict(report, canary.verdict.reason)

    def _policy(self, version: str) -> PolicyFactory:
        """One factory per version, so that a replay as served makes one policy of each."""
        got = self._factories.get(version)
        if got is None:
            sched = self.load(version.removeprefix("v"))
            got = self._factories[version] = PolicyOf(sched, version)
        return got

    def close(self) -> None:
        """Stop the replays' worker processes, if any ran."""
        self.replays.close()


def replay_verdict(report: WindowReport, canary: str = "") -> Verdict:
    """A judged window's verdict as it is acted on, its reason naming the judge (and the
    canary's, for a promotion)."""
    assert report.verdict is not None
    v = report.verdict
    reason = f"replay: {v.reason}" + (f"; {canary}" if canary else "")
    return Verdict(v.decision, reason, v.rule, v.stats)
