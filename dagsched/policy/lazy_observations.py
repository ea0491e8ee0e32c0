"""A batch's observations built when they are read, from its placements.

The compiled serving loop (`greedy_kernel`) decides without building an `Observation` per
task: the daemon reads only the first (`call_log.snapshot` checks it against `observe`)
and training reads them all. `LazyObservations` is that list: item `i` is the observation
the numpy loop would have built, `BatchObservation.nodes` and `cluster` on the batch's view
with placements 0..i-1 taken, bit for bit `observe`'s. Reading in order replays each
placement once; reading backwards starts the replay again from the snapshot. Built items
are kept, so reading one twice gives the same object.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import numpy as np

from dagsched.core.observation import Observation
from dagsched.core.scheduler import Placement
from dagsched.policy.vectorised_observation import BatchObservation


class LazyObservations(Sequence[Observation]):
    """The observations of a batch placed in one or more compiled calls: per call its
    `BatchObservation` (whose `view` must be that call's snapshot, nothing taken yet: this
    object takes the placements on it) and its placements, in order."""

    def __init__(self, *calls: tuple[BatchObservation, Sequence[Placement]]) -> None:
        self._calls = [_Call(obs, placements) for obs, placements in calls]
        self._where = [(c, k) for c in self._calls for k in range(len(c))]

    def __len__(self) -> int:
        return len(self._where)

    @overload
    def __getitem__(self, i: int) -> Observation: ...

    @overload
    def __getitem__(self, i: slice) -> list[Observation]: ...

    def __getitem__(self, i: int | slice) -> Observation | list[Observation]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        call, k = self._where[range(len(self))[i]]  # IndexError and negative indices as a list's
        return call.get(k)

    def __iter__(self) -> Iterator[Observation]:
        return (self[k] for k in range(len(self)))


class _Call:
    """One compiled call's observations, built when read."""

    def __init__(self, obs: BatchObservation, placements: Sequence[Placement]) -> None:
        self._obs = obs
        self._placements = list(placements)
        view = obs.view
        self._snapshot = tuple(
            a.copy() for a in (view.free_cores, view.free_mem, view.queue_len, view.queued_core_s)
        )
        self._taken = 0  # placements taken on obs.view so far
        self._built: list[Observation | None] = [None] * len(self._placements)

    def __len__(self) -> int:
        return len(self._placements)

    def get(self, k: int) -> Observation:
        hit = self._built[k]
        if hit is None:
            hit = self._built[k] = self._build(k)
        return hit

    def _build(self, k: int) -> Observation:
        obs = self._obs
        if self._taken > k:  # read backwards: from the snapshot again
            view = obs.view
            for live, saved in zip(
                (view.free_cores, view.free_mem, view.queue_len, view.queued_core_s),
                self._snapshot,
                strict=True,
            ):
                np.copyto(live, saved)
            obs.view_changed()
            self._taken = 0
        while self._taken < k:
            p = self._placements[self._taken]
            obs.take(self._taken, p.node, p.cpu, p.mem)
            self._taken += 1
        nodes, _ = obs.nodes(k)
        return obs.observation(k, nodes, obs.cluster(k))
