"""The fault model: when nodes crash and come back, and the world changes that bring
failures, the drift and the shift.

`FaultModel` is a collaborator the engine holds. It owns the fault generator, each node's
failure rate and up-since time, and the drift and shift in effect, and it answers with the
events the engine pushes (a crash, a repair): the engine plays what a fault does to attempts
and queues. Crashes are drawn per node from an exponential at the node's failure rate,
repairs from one at `faults.repair_mean_s`.

A drift (`ScenarioConfig.drift`, or `Simulator.drift()` at any time) makes some nodes slower
than their advertised speed and raises their failure rates. Policies are not told:
`cluster.speed` keeps the advertised figures, only `cluster.slowdown` (which policies must not
read) changes.

A shift (`ScenarioConfig.shift`, or `Simulator.shift()` at any time) switches on the shifted
world's effects (`sim.shift`): a long restart after an OOM kill, wider memory peaks, noisy
neighbours. Policies are not told either; only outcomes show it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dagsched.sim.cluster import Cluster
from dagsched.sim.config import DriftConfig, FaultConfig, ShiftConfig
from dagsched.sim.events import NODE_DOWN, NODE_UP

# (time, kind, object, token): an event for the engine's heap
Event = tuple[float, int, Any, int]


class FaultModel:
    """Node crashes and repairs, the drift and the shift; returns the events they bring."""

    def __init__(self, faults: FaultConfig, cluster: Cluster, rng: np.random.Generator) -> None:
        n = cluster.n
        self.cluster = cluster
        self.repair_mean_s = faults.repair_mean_s
        self._rng = rng
        rate_s = faults.node_failure_per_hour / 3600.0
        self._rate_s = [rate_s] * n  # per node: a drift raises some
        self._token = [0] * n  # invalidates a node's pending crash on drift
        self.up_since = [0.0] * n
        self.drifted_at: float | None = None
        self.shift: ShiftConfig | None = None  # the shift in effect (hidden from policies)
        self.mem_spread = 1.0  # how much wider memory peaks are drawn (the shift's)
        self.shifted_at: float | None = None

    def crash(self, node: int, now: float) -> Event | None:
        """The node's next crash, drawn at its current rate (None if it never fails)."""
        rate = self._rate_s[node]
        if rate <= 0:
            return None
        return (now + self._rng.exponential(1 / rate), NODE_DOWN, node, self._token[node])

    def is_current(self, node: int, token: int) -> bool:
        """Whether a crash event of `node` with this token was drawn at its current rate."""
        return token == self._token[node]

    def went_down(self, node: int, now: float) -> tuple[float, Event]:
        """The node crashed now: the seconds it had been up, and its repair event."""
        up = now - self.up_since[node]
        return up, (now + self._rng.exponential(self.repair_mean_s), NODE_UP, node, 0)

    def came_up(self, node: int, now: float) -> Event | None:
        """The node is back now: its next crash."""
        self.up_since[node] = now
        return self.crash(node, now)

    def up_seconds(self, now: float) -> float:
        """Seconds the live nodes have been up since they last came up."""
        return sum(
            now - since for since, ok in zip(self.up_since, self.cluster.alive, strict=True) if ok
        )

    def drift(self, d: DriftConfig, now: float) -> tuple[tuple[int, ...], list[Event]]:
        """Apply `d` now (its `at_s` is ignored): the drifted nodes, and their redrawn crashes.

        Crashes are memoryless, so a live node's pending crash is redrawn at the new rate.
        """
        c = self.cluster
        nodes = d.nodes(c.n)
        events: list[Event] = []
        for node in nodes:
            c.slowdown[node] *= d.slowdown
            c.transient_failure[node] = min(0.99, c.transient_failure[node] * d.failure_mult)
            self._rate_s[node] *= d.failure_mult
            self._token[node] += 1
            if c.alive[node] and (crash := self.crash(node, now)) is not None:
                events.append(crash)
        self.drifted_at = now
        return nodes, events

    def start_shift(self, cfg: ShiftConfig, now: float) -> None:
        """Switch the shifted world on now (its `at_s` is ignored): attempts starting from now
        pay its effects, workflows arriving from now draw its memory spread."""
        self.shift = cfg
        self.mem_spread = cfg.mem_spread
        self.shifted_at = now
