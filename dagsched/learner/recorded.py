"""Recorded traffic read back from the broker as replay windows: what `dagsched models
compare --recorded` replays.

The evaluator records traffic as it consumes it (`learner.replay_gate`). This reads the same
topics once, from their start to the offsets they had when the read began, and feeds the
same recorder through the evaluator's own `Recording`: every message to a `MessageFeed`,
and every workflow's end as the evaluator finds it (`OutcomeJoiner` and `WorkflowOutcomes`:
its last task finished, or a task out of retries) with the version that served it. The topics are
read one after another, so the records are put back in the order they were appended
(their broker timestamps) before they are fed: the recorder snapshots the per-family
history at each window's start, and the history must be the one the events had built by
then.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aiokafka import AIOKafkaConsumer, TopicPartition

from dagsched.learner.joining import OutcomeJoiner
from dagsched.learner.live_ab import WorkflowOutcomes
from dagsched.learner.replay_feed import MessageFeed
from dagsched.learner.replay_gate import Recording
from dagsched.learner.replay_judge import ObservedWindow, ReplayJudgeConfig, TrafficRecorder
from dagsched.schemas.messages import BadMessage, WorkflowMsg, decode
from dagsched.settings import Settings

# what the evaluator reads, less the decision log (its covariates only adjust the live A/B)
TOPICS = ("tasks", "decisions", "events")


@dataclass
class Recorded:
    """The windows the recorded traffic closed, and what was read to get them."""

    windows: list[ObservedWindow] = field(default_factory=list)
    bad: int = 0  # records that did not decode (the daemon dead-lettered them)
    workflows: int = 0  # workflows that arrived
    ended: int = 0  # of them, those whose outcome was recorded


async def read_records(settings: Settings, timeout_s: float = 30.0) -> list[tuple[int, bytes]]:
    """(broker timestamp in ms, value) of every record on the `TOPICS` up to the offsets
    they had when the read began, in append order across topics."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=5,
        request_timeout_ms=int(timeout_s * 1000),
    )
    await consumer.start()
    try:
        existing = await consumer.topics()
        tps = [
            TopicPartition(topic, p)
            for topic in (settings.topic(n) for n in TOPICS)
            if topic in existing
            for p in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not tps:
            return []
        consumer.assign(tps)
        end = await consumer.end_offsets(tps)
        for tp in tps:  # from offset 0: one out of range (retention) resets to the earliest
            consumer.seek(tp, 0)
        out: list[tuple[int, int, bytes]] = []
        left = {tp for tp in tps if end[tp] > 0}
        while left:
            got = await consumer.getmany(*left, timeout_ms=200, max_records=5000)
            for tp, recs in got.items():
                for r in recs:
                    if r.offset < end[tp] and r.value is not None:
                        out.append((r.timestamp, len(out), r.value))
            for tp in list(left):
                if await consumer.position(tp) >= end[tp]:
                    left.discard(tp)
        out.sort()
        return [(ts, value) for ts, _, value in out]
    finally:
        await consumer.stop()


def windows_of(
    settings: Settings,
    cfg: ReplayJudgeConfig,
    records: list[tuple[int, bytes]],
    fit_window: bool = False,
) -> Recorded:
    """Feed `records` (as `read_records` returns them) to a recorder as the evaluator does;
    the windows closed once they are all in (a window closes when its workflows have all
    ended, or two later windows filled). `fit_window`: a recording shorter than one window
    is one window."""
    messages = []
    got = Recorded()
    for _, value in records:
        try:
            messages.append(decode(value))
        except BadMessage:
            got.bad += 1
    if fit_window:
        arrived = sum(isinstance(m, WorkflowMsg) for m in messages)
        if 0 < arrived < cfg.window_workflows:
            cfg = replace(cfg, window_workflows=arrived)
    recorder = TrafficRecorder.of(cfg)
    feed = MessageFeed(recorder, settings.daemon.max_dag_tasks, settings.sim.cluster.speed)
    # the evaluator's own path from messages to workflow ends; a recording has no wall clock
    # to time an attempt out by, so an attempt with no outcome yet stays open
    joiner = OutcomeJoiner(
        settings.sim.reward, settings.evaluator.outcome_timeout_s, settings.daemon.max_dag_tasks
    )
    joiner.wait_for_log = False
    joined = [j for msg in messages for j in joiner.add(msg, 0.0)]
    got.ended = len(Recording(WorkflowOutcomes(joiner), feed).take(messages, joined))
    got.workflows = recorder.arrivals
    got.windows = recorder.ready(feed.families())
    return got
