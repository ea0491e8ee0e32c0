"""The A/B evaluator's core, free of Kafka: per-workflow outcomes per arm, the sequential
test, the guardrail after a promotion, and the Redis lease that lets one evaluator act.

A workflow is one sample: SLA 1 when every task finished by `arrival + deadline`, 0 when it
failed (a task failed more than its `max_retries` times) or finished late; reward = mean reward of
its attempts; speed = `workflow_speed`, -log(JCT / deadline). Workflows are counted for the arm
and version that decided their first task.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
import structlog

from dagsched.learner.adjustment import Congestion, congestion, covariates
from dagsched.learner.canary import CanaryCheck, CanaryRule, check
from dagsched.learner.decision_log import DecisionLogError, decode_view
from dagsched.learner.joining import Joined, OutcomeJoiner
from dagsched.learner.sequential import (
    ABTest,
    DecisionRule,
    MetricStats,
    Running,
    Verdict,
    compare,
)
from dagsched.schemas.messages import DecisionBatchMsg
from dagsched.service_config import EvaluatorSettings
from dagsched.sim.replay_world import FAILED_JCT_RATIO  # the replay judge counts failures alike

log = structlog.get_logger(__name__)

MAX_UNFINISHED = 100_000  # workflows whose covariates wait for their outcome


def rule_from(cfg: EvaluatorSettings) -> DecisionRule:
    """The decision rule from the evaluator settings."""
    return DecisionRule(
        alpha=cfg.alpha,
        min_samples=cfg.min_samples,
        max_samples=cfg.max_samples,
        tau={"sla": cfg.tau_sla, "reward": cfg.tau_reward, "speed": cfg.tau_speed},
        adjust=cfg.adjust,
        min_effect={
            "sla": cfg.min_effect_sla,
            "reward": cfg.min_effect_reward,
            "speed": cfg.min_effect_speed,
        },
    )


def workflow_speed(jct_s: float, deadline_s: float, failed: bool) -> float:
    """-log(JCT / deadline): 0 for a workflow that took its whole deadline, log 2 for one done
    in half of it. A failed workflow counts as taking at least `FAILED_JCT_RATIO` deadlines,
    however early it failed."""
    ratio = max(jct_s, 1e-3) / max(deadline_s, 1e-9)
    if failed:
        ratio = max(ratio, FAILED_JCT_RATIO)
    return -math.log(ratio)


# the arms no test counts: the daemon's fallback heuristic, the exploration slice's sampling
UNJUDGED_ARMS = ("fallback", "explore")
# the arms the serving version did not serve (the fallback heuristic serves in its stead)
NOT_SERVING_ARMS = ("challenger", "explore", "holdback")


@dataclass
class _Tally:
    arm: str
    version: str
    rewards: list[float] = field(default_factory=list)
    done: set[int] = field(default_factory=set)
    failures: dict[int, int] = field(default_factory=dict)  # task -> failed attempts
    last_end: float = 0.0
    failed: bool = False


@dataclass
class Sample:
    """One finished workflow."""

    workflow_id: str
    arm: str
    version: str
    sla: float
    reward: float
    speed: float  # workflow_speed
    covariates: tuple[float, ...] | None = None  # adjustment.covariates, for the test
    jct_s: float = 0.0  # from arrival to its last task's end (or to the failure that ended it)

    @property
    def judged(self) -> bool:
        """Whether the A/B test and the guardrail count it: not a workflow of the fallback
        (the daemon's heuristic) or of the exploration slice (sampled actions)."""
        return self.arm not in UNJUDGED_ARMS

    @property
    def serving(self) -> bool:
        """Whether the serving version served it (or the daemon's fallback heuristic in its
        stead): what a replay of its window as served plays it with."""
        return self.arm not in NOT_SERVING_ARMS


class WorkflowOutcomes:
    """Turns joined attempts into one `Sample` per finished workflow."""

    def __init__(self, joiner: OutcomeJoiner) -> None:
        self.joiner = joiner
        self.tallies: dict[str, _Tally] = {}
        # per workflow, the congestion of the batch its first task was placed in
        self.congestion: dict[str, Congestion] = {}
        self.with_covariates = 0  # samples made with covariates (the others: unadjusted)

    def note(self, msg: DecisionBatchMsg) -> None:
        """A logged batch: the covariates of the workflows it placed first (decoding its view
        once, only when it holds such a workflow)."""
        if msg.view is None or msg.arm in UNJUDGED_ARMS:
            return
        new = {t.workflow_id for t in msg.tasks if t.new and t.attempt == 0}
        new -= self.congestion.keys()
        if not new:
            return
        try:
            seen = congestion(decode_view(msg.view))
        except DecisionLogError:
            return
        for wf_id in new:
            self.congestion[wf_id] = seen
        while len(self.congestion) > MAX_UNFINISHED:  # workflows that never finish: oldest out
            del self.congestion[next(iter(self.congestion))]

    def add(self, j: Joined) -> Sample | None:
        """The workflow's sample once `j` ends it (a fallback or exploration workflow's too,
        for the replay judge's recorder: `Sample.judged` says whether a test may count it)."""
        info = self.joiner.workflows.get(j.workflow_id)
        if info is None:
            return None
        t = self.tallies.setdefault(j.workflow_id, _Tally(j.arm, j.version))
        t.rewards.append(j.reward)
        task = int(j.key[0].rsplit("/", 1)[1])
        if j.failed:
            # as the simulator does: a task may fail max_retries times and still be retried
            t.failures[task] = t.failures.get(task, 0) + 1
            if t.failures[task] > j.max_retries:
                t.failed = True
        else:
            t.done.add(task)
            t.last_end = max(t.last_end, j.end_at)
        if not t.failed and len(t.done) < info.wf.size:
            return None
        del self.tallies[j.workflow_id]
        wf = info.wf
        end = max(t.last_end, j.end_at)
        met = not t.failed and t.last_end <= wf.arrival_s + wf.deadline_s
        speed = workflow_speed(end - wf.arrival_s, wf.deadline_s, t.failed)
        x = covariates(wf, self.congestion.pop(j.workflow_id, None))
        self.with_covariates += x is not None
        return Sample(
            j.workflow_id,
            t.arm,
            t.version,
            float(met),
            sum(t.rewards) / len(t.rewards),
            speed,
            x,
            end - wf.arrival_s,
        )


Action = tuple[str, Verdict]  # ("promote" | "retire" | "rollback" | "clear", why)
# The guardrail judges a new champion only once this many of its workflows have finished, and
# compares it with the holdback slice only once that has as many. At one, a single late
# workflow of a version as good as the old one looked significant (the normal bound on a
# one-sample mean): in simulation, 6.5% of hand promotions of an identical version were rolled
# back at an SLA of 0.95, 16% at 0.85; from ten, 0.65% and 0.1%, while a version at SLA 0.5 is
# still rolled back every time, after ~35 workflows instead of ~19 (docs/concepts/learning.md,
# "The evaluator").
GUARDRAIL_MIN_SAMPLES = 10
HOLDBACK_ARM = "holdback"


@dataclass
class Watch:
    """The guardrail on a new champion: its SLA against the old champion's. While the old
    champion serves a holdback slice (`held`), the baseline is that slice in the same minutes,
    once it has `GUARDRAIL_MIN_SAMPLES` workflows (none before). Without one, or with too few
    of its workflows when the window ends, it is the old champion's record before the
    promotion, which a world that slows or speeds up meanwhile biases."""

    version: str
    previous: str | None
    before: Running
    held: bool = False  # the old champion serves a holdback slice
    new: Running = field(default_factory=Running)
    holdback: Running = field(default_factory=Running)

    def baseline(self, window_over: bool) -> tuple[Running, str] | None:
        if self.holdback.n >= GUARDRAIL_MIN_SAMPLES:
            return self.holdback, "its holdback slice"
        if self.held and not window_over:
            return None  # wait for the slice rather than judge on a moving world
        return self.before, "its record before the promotion"


class Judge:
    """The A/B test between the current champion and challenger versions, and the guardrail
    that watches a freshly promoted champion against the one it replaced (`Watch`): after the
    test promoted it (`promoted`), or after a promotion by hand (`versions` sees the champion
    change with the old one as `previous`; the record before is then the old champion's SLA
    over every workflow it served while this judge watched). The guardrail rolls the new
    champion back when it is significantly worse, and clears it ("clear": its holdback slice
    can end) after `guardrail_window` of its workflows.

    With a `canary` rule the test promotes nothing: it is the challenger slice's
    non-inferiority guardrail (`learner.canary`), which retires a challenger whose slice is
    worse than the margin and tells (`canary`) whether a replay win may promote."""

    def __init__(
        self, rule: DecisionRule, guardrail_window: int, canary: CanaryRule | None = None
    ) -> None:
        self.rule = rule
        self.guardrail_window = guardrail_window
        self.canary_rule = canary
        self.champion: str | None = None
        self.challenger: str | None = None
        self.test = ABTest(rule)
        self.canary: CanaryCheck | None = None  # the canary after the last challenger sample
        self.watch: Watch | None = None
        self.cleared: list[tuple[str, MetricStats]] = []  # champions whose guardrail ended clean
        self.served = Running()  # SLA of every workflow the current champion served

    def versions(
        self,
        champion: str | None,
        challenger: str | None,
        previous: str | None = None,
        holdback: str | None = None,
    ) -> None:
        """The registry's aliases now; a new pair restarts the test. A champion that replaced
        the current one, which is now `previous`, is a promotion: watched by the guardrail
        (unless the test's own promotion already watches it). `holdback`: the version that
        serves the holdback slice; the old champion's makes it the guardrail's baseline."""
        if champion != self.champion:
            handmade = previous is not None and previous == self.champion
            if (
                handmade
                and champion is not None
                and (self.watch is None or self.watch.version != champion)
            ):
                self.watch = Watch(champion, previous, self.served)
            self.served = Running()
        if (champion, challenger) != (self.champion, self.challenger):
            self.champion, self.challenger = champion, challenger
            self.test = ABTest(self.rule)
            self.canary = None
        w = self.watch
        if w is not None and holdback is not None and holdback == w.previous:
            w.held = True

    def promoted(self) -> None:
        """Start the guardrail: the old champion's SLA so far against the new one's."""
        old = self.test.arms["champion"]["sla"]
        if self.challenger is not None:
            self.watch = Watch(self.challenger, self.champion, old)

    def add(self, s: Sample) -> Action | None:
        w = self.watch
        if w is not None and s.arm == HOLDBACK_ARM:
            if s.version == w.previous:
                w.holdback.add(s.sla)
            return None
        guard = self._guard(w, s) if w is not None and s.version == w.version else None
        if guard is not None and guard[0] == "rollback":
            return guard
        if s.version == self.champion:
            self.served.add(s.sla)
        arm = {self.champion: "champion", self.challenger: "challenger"}.get(s.version)
        if arm is None or self.challenger is None:
            return guard
        self.test.add(arm, s.sla, s.reward, s.speed, s.covariates)
        if guard is not None:
            return guard  # the test's verdict waits for its next sample
        if self.canary_rule is not None:
            self.canary = check(self.test, self.canary_rule)
            if self.canary.status == "worse":
                return "retire", self.canary.verdict
            if self.canary.workflows >= self.rule.max_samples:  # no replay verdict in time
                v = self.canary.verdict
                why = f"budget of {self.rule.max_samples} challenger workflows spent"
                return "retire", Verdict("retire", why, v.rule, v.stats)
            return None
        if self.test.arms[arm]["sla"].n % 10:
            return None  # the test is valid at any time; checking every 10th sample is cheaper
        v = self.test.verdict()
        return (v.decision, v) if v.decision != "continue" else None

    def _guard(self, w: Watch, s: Sample) -> Action | None:
        """One of the watched champion's workflows: roll it back, clear it, or go on."""
        w.new.add(s.sla)
        base = w.baseline(window_over=w.new.n >= self.guardrail_window)
        if base is None:
            return None
        old, against = base
        stats = compare(old, w.new, self.rule.tau["sla"], self.rule.alpha, self.rule.var_floor)
        if w.new.n >= GUARDRAIL_MIN_SAMPLES and stats.upper < 0:
            self.watch = None
            text = (
                f"guardrail: SLA of {w.version} significantly below the previous champion's "
                f"({against})"
            )
            return "rollback", Verdict("retire", text, self.rule.describe(), {"sla": stats})
        if w.new.n < self.guardrail_window:
            return None
        self.watch = None
        self.cleared.append((w.version, stats))
        log.info(
            "evaluator.guardrail_cleared",
            version=w.version,
            against=against,
            workflows=w.new.n,
            holdback_workflows=w.holdback.n,
            sla=round(w.new.mean, 4),
            previous_sla=round(old.mean, 4),
            diff_lower=round(stats.lower, 4),
        )
        text = (
            f"guardrail: {w.version} no worse than the previous champion ({against}) over "
            f"{w.new.n} workflows"
        )
        return "clear", Verdict("promote", text, self.rule.describe(), {"sla": stats})


class Lease:
    """A Redis lease (SET NX PX + token): only its holder acts; it must renew within ttl."""

    _RENEW = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then "
        "return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end"
    )
    _RELEASE = (
        "if redis.call('get', KEYS[1]) == ARGV[1] then "
        "return redis.call('del', KEYS[1]) else return 0 end"
    )

    def __init__(self, redis: aioredis.Redis, key: str, ttl_s: float) -> None:
        self.redis = redis
        self.key = key
        self.ttl_ms = int(ttl_s * 1000)
        self.token = secrets.token_hex(8)
        self.held = False
        self._until = 0.0  # monotonic time when our last grant runs out

    @property
    def valid(self) -> bool:
        """Held, and the last grant has not run out (a stale belief expires by itself)."""
        return self.held and time.monotonic() < self._until

    async def acquire(self) -> bool:
        """Take the lease, or renew it if held; False when another holder has it."""
        asked = time.monotonic()
        if self.held:
            ok = await self.redis.eval(self._RENEW, 1, self.key, self.token, self.ttl_ms)
            self.held = bool(ok)
        else:
            self.held = bool(await self.redis.set(self.key, self.token, nx=True, px=self.ttl_ms))
        if self.held:
            self._until = asked + self.ttl_ms / 1000
        return self.held

    async def release(self) -> None:
        if self.held:
            await self.redis.eval(self._RELEASE, 1, self.key, self.token)
            self.held = False


VerdictSink = Callable[[dict[str, Any]], None]
