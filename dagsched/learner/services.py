"""`dagsched learner` and `dagsched evaluator`: the Kafka shells around `online` and
`evaluation`.

Both consume `tasks` (workflows), `decisions`, `events` (and the learner `decisionlog`) in
their own consumer group with auto-commit off. The learner commits after each round is
registered, so a restart resumes from the last round's offsets and from the latest shadow or
challenger. One challenger is under test at a time: a due round waits (still joining outcomes
into its window) until the evaluator has promoted or retired the current one, unless
`learner.keep_learning` is on: then the round registers a new version under the `shadow` alias
instead (chained from the latest shadow or challenger of the current champion), which the
daemons serve on the exploration slice. The evaluator, when it promotes or retires the
challenger, makes the shadow the next challenger at once (`Promoter.shadow_to_challenger`),
so the learner's next round finds a test running again (a shadow round that was training
when a test ended with no shadow to follow it becomes the challenger itself). With
`learner.min_rounds` > 1 the first challenger of each champion waits until that many rounds
were chained on the shadow.
The evaluator acts only while it holds the Redis lease; a second one waits for it. With
`evaluator.judge: replay` (the default) it promotes on the replay judge's verdict once the
challenger's live slice, the canary, is clean; the per-workflow A/B on that slice only
retires a challenger that is worse than its margin (`learner.canary`, `learner.replay_gate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer

from dagsched.learner.canary import CanaryRule
from dagsched.learner.head_search import SearchStopped, WindowSearch
from dagsched.learner.joining import Joined, OutcomeJoiner
from dagsched.learner.live_ab import Action, Judge, Lease, WorkflowOutcomes, rule_from
from dagsched.learner.online import FinetuneConfig, finetune_heads, learning_window
from dagsched.learner.replay_feed import MessageFeed
from dagsched.learner.replay_gate import Job, Recording, ReplayGate, replay_verdict
from dagsched.learner.replay_judge import WindowReport, config_from, statistics
from dagsched.policy.model import ActorCritic
from dagsched.policy.scheduler import GNNScheduler
from dagsched.schemas.messages import BadMessage, DecisionBatchMsg, DecisionLogMsg, decode
from dagsched.settings import Settings

log = structlog.get_logger(__name__)


async def commit(consumer: AIOKafkaConsumer, who: str) -> None:
    """Commit the consumer's position; a failure (the group rebalanced while this process was
    busy or the broker was away) is logged: the records are read again, not lost."""
    from aiokafka.errors import KafkaError

    try:
        await consumer.commit()
    except KafkaError as exc:
        log.warning(f"{who}.commit_failed", error=str(exc))


async def _renewed(lease: Lease) -> bool:
    """Renew the lease; False when Redis does not answer (act only when sure)."""
    from redis.exceptions import RedisError

    try:
        return await lease.acquire()
    except RedisError:
        return False


LEASE_KEY = "dagsched:evaluator:lease"
BUSY_RECHECK_S = 2.0  # how often a learner with a full window asks if the challenger is judged


def _consumer(
    settings: Settings, group: str, *names: str, max_poll_interval_s: float = 300.0
) -> AIOKafkaConsumer:
    """A consumer of `names` in `group`, committing by hand; it may go `max_poll_interval_s`
    between polls before the group takes its partitions away."""
    return AIOKafkaConsumer(
        *(settings.topic(n) for n in names),
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=settings.topic_prefix + group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
        max_poll_interval_ms=int(max_poll_interval_s * 1000),
    )


def _decoded(records: dict[Any, list[Any]]) -> list[Any]:
    out = []
    for recs in records.values():
        for r in recs:
            with contextlib.suppress(BadMessage):
                out.append(decode(r.value))
    return out


def _rounded(x: float | None) -> float | None:
    return round(x, 4) if x is not None else None


class LearnerService:
    """Joins outcomes into a replay window and registers a fine-tuned challenger per round."""

    def __init__(self, settings: Settings) -> None:
        from dagsched.registry.promotion import redis_notifier
        from dagsched.registry.serving import model_channel
        from dagsched.registry.store import Registry

        self.settings = settings
        self.cfg = settings.learner
        self.registry = Registry(settings)
        # daemons reload a new @challenger or @shadow at once, not at their next poll
        self.notify = redis_notifier(settings, model_channel(settings))
        self.joiner = OutcomeJoiner(
            settings.sim.reward, self.cfg.outcome_timeout_s, settings.daemon.max_dag_tasks
        )
        self.window: deque[Joined] = deque(maxlen=self.cfg.window)
        self.completed = 0
        self.busy = False  # a round is fine-tuning or searching
        self.rounds: list[str] = []  # versions registered, in order
        # each head search run (`learner.method: search`): the windows and what it found
        self.searched: list[dict[str, Any]] = []
        self.aliases: list[str] = []  # the alias each of them got (challenger or shadow)
        self.waited = 0  # due checks that found a challenger under test and waited
        self._waiting_on: str | None = None
        # learner.method search: the traffic it consumes, recorded in windows as the
        # evaluator records them, for its rounds to replay
        self.gate: ReplayGate[MessageFeed] | None = None
        self.recording: Recording | None = None
        self._stop: asyncio.Event | None = None  # `run`'s: a search in its thread stops on it
        if self.cfg.method == "search":
            self.gate = ReplayGate.on_wire(settings, self.registry.load)
            self.recording = Recording(WorkflowOutcomes(self.joiner), self.gate.feed)
        self.searches = WindowSearch(
            self.cfg.search,
            config_from(settings.evaluator.replay).seed,
            self.gate.replays if self.gate is not None else None,
        )

    async def run(self, stop: asyncio.Event) -> None:
        # a round (a search: minutes) runs between two polls
        consumer = _consumer(
            self.settings, self.cfg.group_id, "tasks", "decisions", "decisionlog", "events",
            max_poll_interval_s=self.cfg.max_round_s,
        )  # fmt: skip
        await consumer.start()
        self._stop = stop
        next_check = 0.0
        try:
            while not stop.is_set():
                got = await consumer.getmany(timeout_ms=500, max_records=2000)
                now = time.time()
                msgs = _decoded(got)
                joined = [j for m in msgs for j in self.joiner.add(m, now)]
                joined += self.joiner.expire(now)
                if self.recording is not None:  # the search's windows
                    self.recording.take(msgs, joined)
                self.completed += len(joined)
                self.window.extend(j for j in joined if j.trainable)
                if (
                    self.completed >= self.cfg.every_n_tasks
                    and self.window
                    and time.monotonic() >= next_check
                ):
                    alias = await asyncio.to_thread(self.next_round)
                    if alias is None:
                        self.waited += 1
                        next_check = time.monotonic() + BUSY_RECHECK_S
                        continue  # keep filling the window; try again later
                    self.busy = True
                    try:
                        version = await asyncio.to_thread(self.round, alias)
                    except SearchStopped:
                        break  # stopping: nothing half-searched is registered
                    finally:
                        self.busy = False
                    self.completed = 0
                    if version is None:  # a search that moved nothing
                        continue
                    self.rounds.append(version)
                    self.aliases.append(alias)
                    await commit(consumer, "learner")
        finally:
            with contextlib.suppress(Exception):
                await consumer.stop()
            if self.gate is not None:
                await asyncio.to_thread(self.gate.close)

    def challenger_busy(self) -> bool:
        """A challenger is under A/B test and may not be replaced (`replace_challenger` off):
        each new challenger restarts the evaluator's test, so replacing it every round would
        keep any verdict from ever being reached."""
        from dagsched.registry.store import CHALLENGER

        if self.cfg.replace_challenger:
            return False
        busy = self.registry.alias_version(CHALLENGER)
        if busy is not None and self.superseding():
            return False  # a round looks for a move that should replace it
        if busy is not None and busy != self._waiting_on:
            log.info("learner.waiting", challenger=busy, reason="under A/B test")
        self._waiting_on = busy
        return busy is not None

    def superseding(self) -> bool:
        """`learner.method: search` with `search.supersede`: a round under test searches the
        windows that closed since the challenger came, to replace it (not with
        `keep_learning`, whose rounds under test make shadows)."""
        return (
            self.cfg.method == "search" and self.cfg.search.supersede and not self.cfg.keep_learning
        )

    def next_round(self) -> str | None:
        """The alias a due round registers its version under: "challenger", "shadow"
        (`keep_learning`: a challenger is under test, or fewer than `min_rounds` rounds were
        made for the current champion), or None: wait for the evaluator's verdict."""
        from dagsched.registry.store import CHALLENGER, CHAMPION, SHADOW

        busy = self.challenger_busy()
        if not self.cfg.keep_learning:
            return None if busy else CHALLENGER
        if busy:
            return SHADOW
        if self.cfg.min_rounds > 1:
            self.registry.ensure_champion()
            champion = self.registry.alias_version(CHAMPION)
            if champion is not None and self._early(champion):
                return SHADOW
        return CHALLENGER

    def _early(self, champion: str) -> bool:
        """`min_rounds`: the next round for `champion` is too early to be its challenger."""
        return self.cfg.min_rounds > 1 and self.rounds_for(champion) + 1 < self.cfg.min_rounds

    def _test_ended_meanwhile(self, champion: str) -> bool:
        """A shadow round whose reason went away while it trained: the evaluator ended the
        test with no shadow to test next, the champion is still the one it started from, and
        `min_rounds` are done. Then it is proposed as the challenger at once (as the
        simulator's loop would have), not left as a shadow until the next due round."""
        from dagsched.registry.store import CHALLENGER, CHAMPION

        reg = self.registry
        return (
            reg.alias_version(CHALLENGER) is None
            and reg.alias_version(CHAMPION) == champion
            and not self._early(champion)
        )

    def rounds_for(self, champion: str) -> int:
        """Rounds registered since `champion` became the champion: the learner's versions
        fine-tuned from it (a shadow re-parented onto it at its promotion is not counted: it
        was made before)."""
        return sum(
            1
            for v in self.registry.versions()
            if v.tags.get("parent") == champion
            and v.tags.get("origin") == "online-learner"
            and not v.tags.get("reparented_from")
        )

    def round(self, alias: str | None = None) -> str | None:
        """Fine-tune the champion's heads on the window (`learner.method: search`: search
        their shifts on the recorded windows); register it under `alias`: the challenger (the
        default; a shadow it was chained from is then dropped) or, with `keep_learning`, the
        shadow. None when a search found no move worth a version."""
        from dagsched.policy.bundle import save_bundle
        from dagsched.registry.store import CHALLENGER, CHAMPION, SHADOW

        alias = alias or CHALLENGER
        if alias not in (CHALLENGER, SHADOW):
            raise ValueError(f"a round registers a challenger or a shadow, not {alias!r}")
        reg = self.registry
        reg.ensure_champion()
        parent = reg.alias_version(CHAMPION)
        assert parent is not None
        champ = reg.load(parent)
        if self.cfg.method == "search":
            found = self._search(parent, champ)
            if found is None:
                return None
            model, metrics, data = found
            start, transitions, tags = None, 0, {"method": "search"}
        else:
            cfg = self.finetune_config()
            window = learning_window(self.window, self.settings.daemon.explore_share > 0)
            start = self.resume_point(parent)
            result = finetune_heads(
                champ.model, champ.normalizer, window, cfg, start=start.model if start else None
            )
            model, metrics, transitions = result.model, result.metrics, len(window)
            keys = sorted({j.version for j in window})
            data = (
                f"online window: {len(window)} transitions from versions {','.join(keys)}; "
                f"first {window[0].key[0]}#{window[0].key[1]}, last {window[-1].key[0]}"
            )
            tags = {"method": "ppo", "credit": cfg.credit}
        resumed = start.version.removeprefix("v") if start else ""
        if alias == SHADOW and self._test_ended_meanwhile(parent):
            alias = CHALLENGER
        with (
            tempfile.TemporaryDirectory() as tmp,
            reg.run("online-finetune", {"parent": parent, "transitions": transitions}) as run,
        ):
            run.log_metrics(metrics, 0)
            save_bundle(Path(tmp), model, champ.normalizer)
            version = reg.register_bundle(
                Path(tmp),
                run.run_id,
                metrics=metrics,
                parent=parent,
                data=data,
                tags={
                    "origin": "online-learner",
                    "resumed_from": resumed,
                    "registered_as": alias,
                    **tags,
                },
                first_is_champion=False,
            )
        reg.set_alias(alias, version)
        if alias == CHALLENGER and self.gate is not None:
            self.gate.versions(f"v{parent}", f"v{version}")  # fresh: windows from now on
        if alias == CHALLENGER and reg.alias_version(SHADOW) is not None:
            reg.delete_alias(SHADOW)  # the new challenger was chained from it: superseded
        self.notify(json.dumps({"action": "register", "alias": alias, "version": version}))
        log.info(
            "learner.round",
            version=version,
            alias=alias,
            parent=parent,
            resumed_from=resumed,
            **metrics,
        )
        return version

    def _search(
        self, parent: str, champ: GNNScheduler
    ) -> tuple[ActorCritic, dict[str, float], str] | None:
        """The champion's heads' shifts searched on the newest recorded windows (model,
        metrics, the version's `data` tag); None with nothing recorded yet, with these
        windows searched already for this champion, or when no move gained."""
        from dagsched.registry.store import CHALLENGER

        gate = self.gate
        assert gate is not None
        rival = self.registry.alias_version(CHALLENGER) if self.superseding() else None
        # the pair the windows must be fresh for: those closed since the challenger came
        gate.versions(f"v{parent}", f"v{rival}" if rival else None)
        gate.next_window()  # windows closed since the last look join `recent`
        windows = list(gate.recent)
        if rival is not None:
            windows = [w for w in windows if w.index >= gate.fresh_from]
        if not windows:
            log.info("learner.search_waiting", reason="no recorded window closed yet")
            return None
        indices = [w.index for w in windows]
        metrics: dict[str, float]
        if rival is not None:
            found = self.searches.supersede(
                champ, self.registry.load(rival), windows, self.settings.sim, self._stopping
            )
            if found is None:
                return None
            res, metrics, held = found.result, found.metrics(), found.rival
            log.info(
                "learner.supersede", parent=parent, challenger=rival, windows=indices, **metrics
            )
        else:
            got = self.searches.run(parent, champ, windows, self.settings.sim, self._stopping)
            if got is None:  # these windows were searched for this champion already
                return None
            res, metrics = got, got.metrics()
            log.info("learner.search", parent=parent, windows=indices, **metrics)
            self.searched.append(
                {"windows": indices, "gain": metrics["search/gain"], "moved": dict(res.moved)}
            )
            if not res.moved:
                return None
        moved = ", ".join(f"{k} {v:+.2f}" for k, v in res.moved.items())
        data = (
            f"replay search over recorded windows {','.join(map(str, indices))}: shifts "
            f"{moved}; mean JCT {res.start.jct_s:.0f} s -> {res.best.jct_s:.0f} s, SLA "
            f"{res.start.sla:.3f} -> {res.best.sla:.3f}"
        )
        if rival is not None:
            data += f"; replaces v{rival}, {held.jct_s:.0f} s on these windows"
        return res.model, metrics, data

    def _stopping(self) -> bool:
        """Whether `run` was told to stop (read from the search's thread)."""
        return self._stop is not None and self._stop.is_set()

    def finetune_config(self) -> FinetuneConfig:
        """A round's PPO settings, from `learner.*`."""
        c = self.cfg
        return FinetuneConfig(
            c.learning_rate,
            c.clip_coef,
            c.ent_coef,
            c.max_grad_norm,
            c.target_kl,
            c.update_epochs,
            c.minibatch_size,
            credit=c.credit,
        )

    def resume_point(self, champion: str) -> GNNScheduler | None:
        """Where a round starts: the latest shadow, else the latest challenger, when it is of
        the current champion's lineage (its `parent` tag is the champion), so learning carries
        across rounds and restarts; None to start from the champion itself."""
        from dagsched.registry.errors import RegistryError
        from dagsched.registry.store import CHALLENGER, SHADOW

        reg = self.registry
        for alias in (SHADOW, CHALLENGER):
            version = reg.alias_version(alias)
            if version is None or version == champion:
                continue
            if reg.parent_of(version) != champion:
                continue  # of an older champion: its lineage ended
            try:
                return reg.load(version)
            except RegistryError as exc:  # tampered or unreadable: the next one, loudly
                log.warning("learner.resume_refused", version=version, error=str(exc))
        return None


class EvaluatorService:
    """Recorded traffic and per-arm outcomes -> the replay judge and the canary (or, with
    `judge: ab`, the per-workflow A/B alone) -> promote, retire or roll back (lease holder
    only)."""

    def __init__(self, settings: Settings, on_verdict: Callable[[dict[str, Any]], None]) -> None:
        from dagsched.registry.promotion import Promoter
        from dagsched.registry.store import Registry

        self.settings = settings
        self.cfg = settings.evaluator
        self.registry = Registry(settings)
        self.promoter = Promoter(self.registry)
        self.joiner = OutcomeJoiner(
            settings.sim.reward, self.cfg.outcome_timeout_s, settings.daemon.max_dag_tasks
        )
        self.joiner.wait_for_log = False
        canary = None
        self.gate: ReplayGate[MessageFeed] | None = None
        if self.cfg.judge == "replay":
            c = self.cfg.canary
            canary = CanaryRule(c.min_workflows, {"sla": c.margin_sla, "speed": c.margin_speed})
            self.gate = ReplayGate.on_wire(settings, self.registry.load)
        self.recording = Recording(
            WorkflowOutcomes(self.joiner), self.gate.feed if self.gate is not None else None
        )
        self.judge = Judge(rule_from(self.cfg), self.cfg.guardrail_window, canary)
        self._judging: asyncio.Task[tuple[WindowReport, Job]] | None = None
        self.on_verdict = on_verdict
        self.actor = f"evaluator:{socket.gethostname()}"
        self.acted = 0
        self.samples = 0  # finished workflows judged (for callers that wait for a drain)
        self.lease: Lease | None = None

    async def run(self, stop: asyncio.Event) -> None:
        from redis.exceptions import RedisError

        from dagsched.redis_connect import async_client

        redis = async_client(self.settings)
        lease = Lease(redis, self.settings.topic_prefix + LEASE_KEY, self.cfg.lease_ttl_s)
        self.lease = lease
        tick = self.cfg.lease_ttl_s / 3
        try:
            while not stop.is_set():
                try:
                    held = await lease.acquire()
                except RedisError as exc:  # Redis away: nobody can hold the lease; try again
                    log.warning("evaluator.redis_unreachable", error=str(exc))
                    held = False
                if held:
                    await self._serve(stop, lease, tick)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), tick)
        finally:
            with contextlib.suppress(Exception):
                await lease.release()
            await redis.aclose()
            if self.gate is not None:  # after `_serve` let go of a window in its replays
                await asyncio.to_thread(self.gate.close)

    async def _serve(self, stop: asyncio.Event, lease: Lease, tick: float) -> None:
        log.info("evaluator.lease_taken", actor=self.actor)
        lost = asyncio.Event()

        async def renew() -> None:
            while not stop.is_set() and not lost.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), tick)
                try:
                    ok = await lease.acquire()
                except Exception:  # Redis away: the grant runs out by itself
                    ok = lease.valid
                if not ok:
                    log.warning("evaluator.lease_lost", actor=self.actor)
                    lost.set()

        renewer = asyncio.create_task(renew())
        # the decision log only for the covariates of each workflow's first batch (the test's
        # regression adjustment); the joiner does not wait for it
        topics = ("tasks", "decisions", "decisionlog", "events")
        consumer = _consumer(self.settings, self.cfg.group_id, *topics)
        refresh_at = 0.0
        try:
            await consumer.start()
            while not stop.is_set() and not lost.is_set():
                if time.monotonic() > refresh_at:
                    await self._refresh()
                    refresh_at = time.monotonic() + tick
                got = await consumer.getmany(timeout_ms=200, max_records=2000)
                now = time.time()
                msgs = _decoded(got)
                joined = [
                    j
                    for m in msgs
                    if not isinstance(m, DecisionBatchMsg | DecisionLogMsg)
                    for j in self.joiner.add(m, now)
                ]
                joined += self.joiner.expire(now)
                # whoever served a workflow, its window closes on its end
                for sample in self.recording.take(msgs, joined):
                    if not sample.judged:
                        continue
                    self.samples += 1
                    await self._act_holding(lease, self.judge.add(sample))
                if self.gate is not None:
                    await self._act_holding(lease, self._replay_step(self.gate))
                if got:
                    await commit(consumer, "evaluator")
        finally:
            renewer.cancel()
            with contextlib.suppress(BaseException):
                await renewer
            if self._judging is not None:  # a window's replays run on in their thread
                self._judging.cancel()
                self._judging = None
            with contextlib.suppress(Exception):
                await consumer.stop()

    async def _act_holding(self, lease: Lease, action: Action | None) -> None:
        """Act on `action`, only under a lease just renewed, never on a stale belief."""
        if action is not None and await _renewed(lease) and lease.valid:
            await asyncio.to_thread(self._act, *action)
            await self._refresh()

    async def _refresh(self) -> None:
        from dagsched.registry.store import CHALLENGER, CHAMPION, HOLDBACK, PREVIOUS

        reg = self.registry
        aliases = (CHAMPION, CHALLENGER, PREVIOUS, HOLDBACK)
        champ, chall, prev, held = await asyncio.to_thread(
            lambda: tuple(reg.alias_version(a) for a in aliases)
        )
        v = lambda x: f"v{x}" if x else None  # noqa: E731
        # a promotion by hand is watched too; a holdback slice is the guardrail's baseline
        self.judge.versions(v(champ), v(chall), v(prev), v(held))
        if self.gate is not None:
            self.gate.versions(v(champ), v(chall))

    @property
    def busy(self) -> bool:
        """The replay judge has work: a window's replays in flight, or closed windows to
        replay."""
        gate = self.gate
        if gate is None:
            return False
        if self._judging is not None:  # in flight, or done and its report not yet taken
            return True
        return bool(gate.waiting or gate.unjudged) or gate.recorder.closable()

    def _replay_step(self, gate: ReplayGate[MessageFeed]) -> Action | None:
        """Take a judged window's report, start judging the next closed one, and say what
        to do now: retire on the replay's word, promote on its win with a clean canary."""
        action = None
        if self._judging is not None and self._judging.done():
            task, self._judging = self._judging, None
            try:
                report, job = task.result()
            except Exception as exc:  # a version that fails to load or play: logged, next window
                log.warning("evaluator.replay_failed", error=str(exc))
            else:
                self._log_window(report, job)
                if gate.take(report, job) == "retire" and report.verdict is not None:
                    action = ("retire", replay_verdict(report))
        if self._judging is None:
            nxt = gate.next_window()
            if nxt is not None:
                obs, job, judge = nxt

                async def judged() -> tuple[WindowReport, Job]:
                    return await asyncio.to_thread(gate.judge_window, obs, job, judge), job

                self._judging = asyncio.create_task(judged())
        return action or self._replay_action()

    def _replay_action(self) -> Action | None:
        """Promote when the replay won for the pair under test and its canary is clean."""
        v = self.gate.promotion(self.judge.canary) if self.gate is not None else None
        return ("promote", v) if v is not None else None

    def _log_window(self, report: WindowReport, job: Job) -> None:
        log.info(
            "evaluator.replay_window",
            champion=job.champion,
            challenger=job.challenger,
            window=report.window,
            decision=report.decision,
            reason=report.reason,
            observed_jct_s=round(report.fidelity.observed_jct_s, 1),
            predicted_jct_s=round(report.fidelity.predicted_jct_s, 1),
            jct_err=_rounded(report.fidelity.jct_err),
            sla_err=_rounded(report.fidelity.sla_err),
            own_jct_err=_rounded(report.own_fidelity.jct_err) if report.own_fidelity else None,
        )

    def _act(self, action: str, verdict: Any) -> None:
        stats = verdict.to_dict()
        version = (self.judge.challenger or "").removeprefix("v")
        if action == "clear":  # the guardrail's: the champion it watched
            version = self.judge.cleared[-1][0].removeprefix("v")
        record: dict[str, Any] = {
            "action": action,
            "version": version,
            **stats,
            "workflows_judged": self.samples,
            "workflows_with_covariates": self.recording.outcomes.with_covariates,
        }
        if self.gate is not None and action in ("promote", "retire"):
            # the audit keeps the replay's verdict, its statistics and fidelity, and the canary
            last = [r for p, r in self.gate.reports if p[1] == self.judge.challenger]
            record["judge"] = "replay"
            record["replay"] = statistics(last[-1]) if last else None
            canary = self.judge.canary
            record["canary"] = (
                {"status": canary.status, "workflows": canary.workflows,
                 **canary.verdict.to_dict()} if canary is not None else None
            )  # fmt: skip
            stats = {**stats, "replay": record["replay"], "canary": record["canary"]}
        lineage = (self.judge.champion or "").removeprefix("v")  # the test's champion
        try:
            if action == "promote":
                holdback = self.settings.daemon.holdback_share > 0
                self.promoter.promote(version, verdict.reason, self.actor, stats, holdback)
                self.judge.promoted()
            elif action == "clear":
                self.promoter.clear(version, verdict.reason, self.actor, stats)
            elif action == "retire":
                self.promoter.retire(version, verdict.reason, self.actor, stats)
            elif action == "rollback":
                self.promoter.rollback(verdict.reason, self.actor, stats)
        except Exception as exc:  # refused or registry away: report, keep evaluating
            record["error"] = str(exc)
        else:
            if action in ("promote", "retire"):
                # keep_learning: the test is over; the learner's latest shadow is tested next
                try:
                    nxt = self.promoter.shadow_to_challenger(lineage, self.actor)
                    if nxt is not None:
                        record["next_challenger"] = nxt
                except Exception as exc:  # the verdict stands; the learner's round goes on
                    record["shadow_error"] = str(exc)
        self.acted += 1
        self.on_verdict(record)
        log.info("evaluator.verdict", **{k: json.dumps(v, default=str) for k, v in record.items()})
