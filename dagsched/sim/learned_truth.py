"""A learned truth: what tasks use and how long they run, drawn from the per-family history.

A replay (`sim.replay_world`) must not read the hidden truth (`sim.truth`): it is built from
what the daemon can know. `LearnedTruth` is the engine's `TruthModel` over the decaying
histograms of `core.history` (the same statistics the daemon keeps in Redis): each task's
CPU use, memory peak and runtime ratios are drawn from its family's histograms, a bucket by
its decayed weight, then uniformly (in log) within the bucket. A family never observed draws
from the pool of every observed family, each weighted by its count; with no history at all
every ratio is 1 (the declaration).

Draws use a fixed number of uniforms per task, whatever the families, so two policies
replaying the same workflows with the same seed see the same ratios for every task (common
random numbers).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from dagsched.core.history import BUCKET_GROWTH, MIN_RATIO, N_BUCKETS, FamilyStats
from dagsched.core.workflow import Workflow
from dagsched.sim.truth import RATIO_BOUNDS, RUNTIME_BOUNDS

_LOG_GROWTH = float(np.log(BUCKET_GROWTH))
_LOG_MIN = float(np.log(MIN_RATIO))


def _cdf(weights: np.ndarray) -> np.ndarray | None:
    total = float(weights.sum())
    if total <= 0:
        return None
    cdf = np.cumsum(weights) / total
    cdf[-1] = 1.0
    return cdf


class LearnedTruth:
    """Per-task (CPU use, memory peak, runtime) ratios drawn from measured family history."""

    def __init__(self, families: Mapping[str, FamilyStats]) -> None:
        self._cdfs: dict[str, list[np.ndarray]] = {}
        pooled = np.zeros((3, N_BUCKETS))
        for name, s in families.items():
            if s.count <= 0:
                continue
            hists = (s.cpu.weights, s.mem.weights, s.runtime.weights)
            cdfs = [_cdf(np.asarray(w, dtype=float)) for w in hists]
            if any(c is None for c in cdfs):
                continue
            self._cdfs[name] = [c for c in cdfs if c is not None]
            for k, w in enumerate(hists):
                pooled[k] += s.count * np.asarray(w, dtype=float) / float(np.sum(w))
        pooled_cdfs = [_cdf(w) for w in pooled]
        self._pooled = (
            [c for c in pooled_cdfs if c is not None] if all(c is not None for c in pooled_cdfs)
            else None
        )  # fmt: skip

    @property
    def families(self) -> int:
        """How many families have a learned distribution."""
        return len(self._cdfs)

    def draw(self, wf: Workflow, rng: np.random.Generator, mem_spread: float = 1.0) -> np.ndarray:
        """[n, 3] ratios for the tasks of `wf` (`mem_spread` is a hidden-world knob: a learned
        truth already holds whatever spread was measured, so it is ignored)."""
        n = wf.size
        u = rng.random((n, 3, 2))  # bucket, then position within it: fixed count per task
        out = np.ones((n, 3))
        for i, t in enumerate(wf.tasks):
            cdfs = self._cdfs.get(t.family, self._pooled)
            if cdfs is None:
                continue
            for k in range(3):
                b = min(int(np.searchsorted(cdfs[k], u[i, k, 0], side="right")), N_BUCKETS - 1)
                out[i, k] = np.exp(_LOG_MIN + (b + u[i, k, 1]) * _LOG_GROWTH)
        np.clip(out[:, :2], *RATIO_BOUNDS, out=out[:, :2])
        np.clip(out[:, 2], *RUNTIME_BOUNDS, out=out[:, 2])
        return out
