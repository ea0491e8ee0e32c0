"""The soak bench's job queue and cluster, in one thread of the bench process.

Job queue: workflows of the default scenario arrive as they are needed to offer `rate`
`task_ready` messages per second (each workflow message first, keyed by its id like its
tasks); a task is ready once all its parents have finished, a failed attempt is asked again
as the next attempt (up to the decision's `max_retries`; then nothing more of its workflow is
asked, and the attempts already asked still run). Every
`task_ready` carries `at`, its send time on the job-queue clock, so batches wait for the
updater as deployed.

Cluster: each decision read back from `dagsched.decisions` is reported started at once with
a node heartbeat, and ends `FINISH_S` x U(0.5, 1.5) later, finished or (4%) failed
(`event_side.end_event`): three events per decision, as in the throughput bench's closed
loop. Dead letters are read from `dagsched.deadletter`.

Nothing grows with the run's length here but the latency samples (8 bytes a task, in
10-second slots by send time): workflows are dropped once they end, tasks once decided.
"""

from __future__ import annotations

import heapq
import json
import random
import threading
import time
from array import array
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagsched.settings import Settings
from harness.chaos_load import _dead_key
from harness.event_side import _heartbeat, end_event
from harness.kafka_io import heartbeats, producer

Key = tuple[str, int, int]  # (workflow id, task, attempt)
FINISH_S = 1.0  # mean wall seconds from an attempt's decision to its end
SLOT_S = 10.0  # latency samples are kept per this many seconds of send time
DONE_KEPT = 2000


@dataclass
class _Wf:
    """A workflow in flight: its tasks, who waits on whom, what is left."""

    tasks: list[Any]  # core TaskSpec
    children: list[list[int]]
    waiting: list[int]  # parents not finished yet, per task
    left: int  # tasks not finished yet
    inflight: int = 0  # attempts asked and not ended
    asked: int = 0  # attempts asked in all (retries included)
    given_up: bool = False  # a task ran out of retries: nothing more is asked


@dataclass
class Counts:
    """What the load did so far (read by the bench between samples)."""

    offered: int = 0  # task_ready handed to the producer
    decided: int = 0  # first decision of a (task, attempt) read back
    duplicates: int = 0  # a decision read again, or for a key never asked (a redelivery)
    dead_letters: int = 0  # records on dagsched.deadletter
    dead_lettered: int = 0  # of them, for a task_ready this load sent
    events: int = 0  # events produced (started, finished / failed, heartbeats)
    retries: int = 0  # failed attempts asked again
    workflows: int = 0  # admitted
    workflows_done: int = 0
    workflows_given_up: int = 0
    produce_errors: int = 0  # deliveries the broker refused
    arms: Counter[str] = field(default_factory=Counter)


class Delivered:
    """Per partition of `dagsched.events`, the events acknowledged and not yet applied: what
    the updater's lag is read from. Trimmed as the updater commits, so it stays as long as
    the lag."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acked: dict[int, deque[tuple[int, float]]] = {}
        self._applied_at: dict[int, float] = {}  # job-queue time of the newest applied event

    def add(self, partition: int, offset: int, at: float) -> None:
        with self._lock:
            self._acked.setdefault(partition, deque()).append((offset, at))

    def behind(self, committed: dict[int, int]) -> tuple[float, int]:
        """(seconds, records): per partition the newest event acknowledged minus the newest
        the group has committed, in job-queue seconds (the worst partition), and the events
        acknowledged and not committed (all partitions)."""
        worst, records = 0.0, 0
        with self._lock:
            for part, q in self._acked.items():
                upto = committed.get(part, 0)
                while q and q[0][0] < upto:
                    self._applied_at[part] = q.popleft()[1]
                if not q:
                    continue
                records += len(q)
                worst = max(worst, q[-1][1] - self._applied_at.get(part, q[0][1]))
        return worst, records


class SoakLoad:
    """Offers `rate` tasks/s of workflows whose tasks become ready as their parents finish
    (see the module docstring), until `stop_offering()`; then keeps answering decisions and
    ending attempts until `close()`."""

    def __init__(
        self, s: Settings, rate: float, linger_ms: float, seed: int = 5, tag: str = "s"
    ) -> None:
        from confluent_kafka import Consumer, TopicPartition

        self.s, self.rate, self.seed, self.tag = s, rate, seed, tag
        self.p = producer(s, linger_ms)
        self.c = Consumer({
            "bootstrap.servers": s.kafka_bootstrap, "group.id": f"{s.topic_prefix}bench-soak",
            "enable.auto.commit": False, "fetch.wait.max.ms": 5, "fetch.min.bytes": 1,
        })  # fmt: skip
        parts = range(s.topics.partitions)
        topics = (s.topic("decisions"), s.topic("deadletter"))
        self.c.assign([TopicPartition(t, p, -1) for t in topics for p in parts])  # from the end
        self.counts = Counts()
        self.delivered = Delivered()
        self.slots: dict[int, array[float]] = {}  # send-time slot -> latencies (s)
        self.arrived: Counter[int] = Counter()  # arrival-time slot -> decisions read back
        self.t0 = 0.0  # wall time the load started (job-queue clock 0)
        self.pending: dict[Key, float] = {}  # asked, not decided: wall time sent
        # the latest workflows done, with the attempts asked for each: what Redis keeps per
        # decision for a whole workflow is read from these
        self.done: deque[tuple[str, int]] = deque(maxlen=DONE_KEPT)
        self._wfs: dict[str, _Wf] = {}
        self._ready: deque[Key] = deque()
        self._ends: list[tuple[float, int, Key, str, Any, int]] = []
        self._seq = 0
        self._hbs = heartbeats()
        self._rng = random.Random(seed)
        self._source = self._workflows()
        self._offering = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="soak-load", daemon=True)

    # -- control (from the bench's thread) ----------------------------------------------------

    def start(self) -> SoakLoad:
        self.t0 = time.time()
        self._offering.set()
        self._thread.start()
        return self

    def now(self) -> float:
        """Seconds since the load started (the job-queue clock)."""
        return time.time() - self.t0

    def stop_offering(self) -> None:
        """No more `task_ready`: attempts decided still run and end."""
        self._offering.clear()

    def drained(self) -> bool:
        """Every task asked has its decision and every attempt decided has ended."""
        return not self.pending and not self._ends

    def running(self) -> int:
        """Attempts decided and not ended yet."""
        return len(self._ends)

    def alive(self) -> bool:
        """Whether the load's thread still runs (it stops only when closed, or on an error)."""
        return self._thread.is_alive()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(30)
        self.c.close()
        self.p = None  # the broker goes next: no reconnection attempts logged meanwhile

    def decided_in(self, t_from: float, t_to: float) -> int:
        """Decisions read back in [t_from, t_to) (whole slots), whenever their tasks were sent."""
        lo, hi = int(t_from // SLOT_S), int(np.ceil(t_to / SLOT_S))
        return sum(self.arrived[i] for i in range(lo, hi))

    def latencies(self, t_from: float, t_to: float) -> np.ndarray:
        """Submit-to-decision latencies (s) of the tasks sent in [t_from, t_to) (whole slots)."""
        lo, hi = int(t_from // SLOT_S), int(np.ceil(t_to / SLOT_S))
        parts = [np.frombuffer(self.slots[i], dtype=np.float64).copy()
                 for i in range(lo, hi) if i in self.slots]  # fmt: skip
        return np.concatenate(parts) if parts else np.zeros(0)

    # -- the job queue ------------------------------------------------------------------------

    def _workflows(self) -> Iterator[tuple[str, Any, bytes]]:
        from dagsched.core.wire import to_message
        from dagsched.sim.config import ScenarioConfig
        from dagsched.sim.runner import stream_workflows

        for wf in stream_workflows(ScenarioConfig(), self.seed, 10**9):
            wf_id = f"{self.tag}-{wf.id}"
            yield wf_id, wf, to_message(wf).model_copy(update={"workflow_id": wf_id}).encode()

    def _admit(self) -> None:
        wf_id, wf, raw = next(self._source)
        self._produce(self.s.topic("tasks"), wf_id, raw)
        waiting = [len(p) for p in wf.parents]
        self._wfs[wf_id] = _Wf(wf.tasks, wf.children, waiting, wf.size)
        self._ready.extend((wf_id, i, 0) for i, n in enumerate(waiting) if n == 0)
        self.counts.workflows += 1

    def _offer(self, due: int) -> None:
        from dagsched.schemas.messages import TaskReadyMsg

        topic = self.s.topic("tasks")
        while due > 0:
            if not self._ready:
                self._admit()
                continue
            k = self._ready.popleft()
            wf = self._wfs.get(k[0])
            if wf is None or wf.given_up:
                continue  # ready before its workflow was given up
            sent = time.time()
            msg = TaskReadyMsg(workflow_id=k[0], task=k[1], attempt=k[2], at=sent - self.t0)
            self.pending[k] = sent
            wf.inflight += 1
            wf.asked += 1
            self._produce(topic, k[0], msg.encode())
            self.counts.offered += 1
            due -= 1

    # -- the cluster --------------------------------------------------------------------------

    def _on_decision(self, raw: bytes, arrived: float) -> None:
        from dagsched.schemas.messages import TaskStartedMsg

        d = json.loads(raw)
        if d.get("type") != "decision":
            return
        k = (d["workflow_id"], d["task"], d["attempt"])
        sent = self.pending.pop(k, None)
        if sent is None:
            self.counts.duplicates += 1
            return
        self.counts.decided += 1
        self.counts.arms[d["arm"]] += 1
        slot = int((sent - self.t0) // SLOT_S)
        self.slots.setdefault(slot, array("d")).append(arrived - sent)
        self.arrived[int((arrived - self.t0) // SLOT_S)] += 1
        wf = self._wfs[k[0]]  # kept while it has attempts in flight
        at, node = arrived - self.t0, d["node"]
        self._event(node, TaskStartedMsg(workflow_id=k[0], task=k[1], attempt=k[2], node=node,
                                         at=at))  # fmt: skip
        hb = _heartbeat(self._hbs, self.counts.decided, at, self._rng)
        self._event(hb.node, hb)
        self._seq += 1
        ends = at + FINISH_S * self._rng.uniform(0.5, 1.5)
        item = (ends, self._seq, k, node, wf.tasks[k[1]], int(d["max_retries"]))
        heapq.heappush(self._ends, item)

    def _on_dead(self, raw: bytes) -> None:
        self.counts.dead_letters += 1
        try:
            k = _dead_key(json.loads(raw))
        except ValueError:
            return
        if k is not None and self.pending.pop(k, None) is not None:
            self.counts.dead_lettered += 1
            wf = self._wfs[k[0]]
            wf.inflight -= 1
            wf.given_up = True  # the task will never run
            self._forget(k[0], wf)

    def _forget(self, wf_id: str, wf: _Wf) -> None:
        """Drop a workflow that is over: every task finished, or given up with nothing left
        in flight."""
        if wf.left == 0 or (wf.given_up and wf.inflight == 0):
            del self._wfs[wf_id]
            if wf.left == 0:
                self.counts.workflows_done += 1
                self.done.append((wf_id, wf.asked))
            else:
                self.counts.workflows_given_up += 1

    def _end(self, at: float) -> None:
        from dagsched.schemas.messages import TaskFinishedMsg

        while self._ends and self._ends[0][0] <= at:
            _, _, (wf_id, task, attempt), node, spec, retries = heapq.heappop(self._ends)
            ev = end_event(self._rng, wf_id, task, node, spec, at, attempt)
            self._event(node, ev)
            wf = self._wfs[wf_id]
            wf.inflight -= 1
            if isinstance(ev, TaskFinishedMsg):
                wf.left -= 1
                for c in wf.children[task]:
                    wf.waiting[c] -= 1
                    if wf.waiting[c] == 0 and not wf.given_up:
                        self._ready.append((wf_id, c, 0))
            elif attempt + 1 < retries and not wf.given_up:
                self._ready.appendleft((wf_id, task, attempt + 1))  # a retry goes first
                self.counts.retries += 1
            else:
                wf.given_up = True
            self._forget(wf_id, wf)

    # -- Kafka --------------------------------------------------------------------------------

    def _refused(self, err: Any, _msg: Any) -> None:
        if err is not None:
            self.counts.produce_errors += 1

    def _produce(self, topic: str, key: str, value: bytes, cb: Any = None) -> None:
        while True:
            try:
                self.p.produce(topic, value, key.encode(), on_delivery=cb or self._refused)
                return
            except BufferError:
                self.p.poll(0.001)

    def _event(self, node: str, msg: Any) -> None:
        at = msg.at

        def acked(err: Any, m: Any) -> None:
            if err is None:
                self.delivered.add(m.partition(), m.offset(), at)
            else:
                self.counts.produce_errors += 1

        self._produce(self.s.topic("events"), node, msg.encode(), acked)
        self.counts.events += 1

    def _run(self) -> None:
        dec = self.s.topic("decisions")
        offered_at = 0  # tasks the pace has asked for so far
        while not self._stop.is_set():
            # block until one record is there (its arrival is when it came), then take what
            # else is queued without waiting
            first = self.c.poll(0.002)
            arrived = time.time()
            msgs = [] if first is None else [first, *self.c.consume(10_000, 0)]
            for m in msgs:
                if m.error():
                    continue
                if m.topic() == dec:
                    self._on_decision(m.value(), arrived)
                else:
                    self._on_dead(m.value())
            now = time.time()
            self._end(now - self.t0)
            if self._offering.is_set():
                due = int((now - self.t0) * self.rate)
                self._offer(due - offered_at)
                offered_at = max(offered_at, due)
            self.p.poll(0)
        self.p.flush(30)
