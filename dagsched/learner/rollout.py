"""Rollouts: a policy places tasks in a running simulator; each decision becomes a transition
whose reward is that attempt's reward, filled in when its outcome is known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dagsched.core.observation import Observation
from dagsched.core.workflow import Workflow
from dagsched.policy.scheduler import GNNScheduler
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.reward import TaskOutcome
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import cluster_view, task_view

EpisodeFactory = Callable[[int], tuple[ScenarioConfig, list[Workflow]]]


@dataclass
class Transition:
    """One decision and, once known, its reward."""

    obs: Observation
    node: int
    unit: list[float]
    logprob: float
    value: float
    reward: float = 0.0
    known: bool = False
    done: bool = False
    at: float = 0.0  # simulated time of the decision


@dataclass
class EpisodeStats:
    """Metrics of finished episodes, for logging."""

    summaries: list[dict[str, float]] = field(default_factory=list)


class RolloutWorker:
    """One simulator instance that keeps running across rollouts (a new episode when the
    previous one ends). `collect(n)` returns the next n transitions with known rewards."""

    def __init__(self, make_episode: EpisodeFactory, seed: int) -> None:
        self.make_episode = make_episode
        self.episode = 0
        self.seed = seed
        self.buffer: list[Transition] = []
        self.pending: dict[tuple[str, int, int], Transition] = {}
        self.stats = EpisodeStats()
        self.sim = self._new_sim()

    def _new_sim(self) -> Simulator:
        scenario, wfs = self.make_episode(self.seed * 100_003 + self.episode)
        self.episode += 1
        self.pending = {}
        return Simulator(
            scenario, wfs, seed=self.seed * 7919 + self.episode, on_outcome=self._on_outcome
        )

    def _on_outcome(self, t: TaskRun, o: TaskOutcome, r: float) -> None:
        tr = self.pending.pop((t.run.wf.id, t.idx, t.attempt), None)
        if tr is not None:
            tr.reward, tr.known = r, True

    def _ready_prefix(self) -> int:
        k = 0
        while k < len(self.buffer) and self.buffer[k].known:
            k += 1
        return k

    def collect(self, n: int, scheduler: GNNScheduler) -> tuple[list[Transition], float]:
        """The next `n` transitions and the value estimate of the state after them."""
        while self._ready_prefix() < n + 1:
            self._step(scheduler)
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out, self.buffer[0].value

    def _step(self, scheduler: GNNScheduler) -> None:
        batch = self.sim.advance()
        if batch is None:
            self.stats.summaries.append(self.sim.summary())
            for tr in self.pending.values():  # decisions whose task was cancelled
                tr.known = True
            if self.buffer:
                self.buffer[-1].done = True
            self.sim = self._new_sim()
            return
        self.buffer += place_batch(self.sim, batch, scheduler, self.pending)


def place_batch(
    sim: Simulator,
    batch: list[TaskRun],
    scheduler: GNNScheduler,
    pending: dict[tuple[str, int, int], Transition],
) -> list[Transition]:
    """`scheduler` places `batch` in `sim`; one transition per decision, registered in
    `pending` (by workflow, task and attempt) until its outcome fills in the reward."""
    placements = scheduler.place(cluster_view(sim), [task_view(t, sim) for t in batch])
    decisions, out = [], []
    for t, o, p, u, v in zip(
        batch,
        scheduler.last_observations,
        placements,
        scheduler.last_units,
        scheduler.last_values,
        strict=True,
    ):
        tr = Transition(o, p.node, u, p.log_prob, v, at=sim.now)
        old = pending.pop((t.run.wf.id, t.idx, t.attempt), None)
        if old is not None:  # requeued by a node crash before it ever started
            old.known = True
        pending[(t.run.wf.id, t.idx, t.attempt)] = tr
        out.append(tr)
        decisions.append(Decision(t, p.node, p.cpu, p.mem, p.max_retries, p.priority))
    sim.apply(decisions, batch)
    return out


def play_episode(
    scenario: ScenarioConfig, workflows: list[Workflow], seed: int, scheduler: GNNScheduler
) -> tuple[list[Transition], dict[str, float]]:
    """One whole episode of `workflows` in a simulator seeded `seed`: its transitions, each
    reward known (0 for a task cancelled before its outcome), and the run's metrics. The
    same arguments give the same world; only the scheduler's sampled actions differ."""
    pending: dict[tuple[str, int, int], Transition] = {}

    def on_outcome(t: TaskRun, o: TaskOutcome, r: float) -> None:
        tr = pending.pop((t.run.wf.id, t.idx, t.attempt), None)
        if tr is not None:
            tr.reward, tr.known = r, True

    sim = Simulator(scenario, workflows, seed=seed, on_outcome=on_outcome)
    out: list[Transition] = []
    while (batch := sim.advance()) is not None:
        out += place_batch(sim, batch, scheduler, pending)
    for tr in pending.values():
        tr.known = True
    if out:
        out[-1].done = True
    return out, sim.summary()


def stack(transitions: list[Transition]) -> dict[str, np.ndarray]:
    """Arrays of the scalar fields of `transitions`."""
    return {
        "node": np.array([t.node for t in transitions], dtype=np.int64),
        "unit": np.array([t.unit for t in transitions], dtype=np.float32),
        "logprob": np.array([t.logprob for t in transitions], dtype=np.float32),
        "value": np.array([t.value for t in transitions], dtype=np.float64),
        "reward": np.array([t.reward for t in transitions], dtype=np.float64),
        "done": np.array([t.done for t in transitions], dtype=np.float64),
    }
