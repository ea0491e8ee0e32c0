"""Per-family history of measured outcomes: what tasks of a family really used and how long
they really ran, relative to what they declared.

This is everything a scheduler may know of the hidden truth, and it is built only from what
`task_finished` / `task_failed` events carry (`measured_ratios`). The simulator keeps one
`History` fed by its own measurements; the daemon keeps the same statistics in Redis from the
events (`daemon.history_store`), with the same arithmetic, so a policy sees the same numbers
in simulation and in production.

After the Kubernetes VPA recommender (`pkg/recommender/util/decaying_histogram.go`): each
ratio goes into a histogram with exponentially spaced buckets (5% apart), each sample
weighted by 2^(t / half-life) so that a sample one half-life older counts half; percentiles
are read off the cumulative weights. Runtime predictions follow Tsafrir, Etsion and
Feitelson (2007): the mean of the family's last two observed runtime ratios.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

HALF_LIFE_S = 24 * 3600.0  # as the VPA recommender's default
BUCKET_GROWTH = 1.05  # bucket i covers [MIN_RATIO x 1.05^i, MIN_RATIO x 1.05^(i+1))
MIN_RATIO = 0.01
N_BUCKETS = 190  # up to 0.01 x 1.05^190 ~ 105
_LOG_GROWTH = math.log(BUCKET_GROWTH)
_LOG_MIN = math.log(MIN_RATIO)
# bucket upper bounds: a percentile reads as the bound below which that share of weight lies
BUCKET_TOP = MIN_RATIO * BUCKET_GROWTH ** np.arange(1, N_BUCKETS + 1)
RESCALE_AT = 1e100  # renormalise weights before they overflow


def sample_weight(at_s: float, ref_s: float) -> float:
    """A sample's weight: doubles every half-life after the reference time."""
    return 2.0 ** ((at_s - ref_s) / HALF_LIFE_S)


def bucket(ratio: float) -> int:
    """The histogram bucket of `ratio` (clamped to the histogram's range)."""
    if ratio <= MIN_RATIO:
        return 0
    i = int((math.log(ratio) - _LOG_MIN) / _LOG_GROWTH)
    return i if i < N_BUCKETS else N_BUCKETS - 1


class DecayingHistogram:
    """Exponentially bucketed ratios with exponentially decaying sample weights."""

    __slots__ = ("ref_s", "total", "weights")

    def __init__(self) -> None:
        self.weights = np.zeros(N_BUCKETS)
        self.total = 0.0
        self.ref_s: float | None = None  # weights are 2^((t - ref_s) / half-life)

    def add(self, ratio: float, at_s: float) -> None:
        """Count one observed ratio at time `at_s`."""
        self.add_to(bucket(ratio), at_s)

    def add_to(self, i: int, at_s: float) -> None:
        """Count one sample in bucket `i` at time `at_s` (the first sample sets the reference
        time; weights are renormalised before they overflow)."""
        if self.ref_s is None:
            self.ref_s = at_s
        w = sample_weight(at_s, self.ref_s)
        if w > RESCALE_AT:
            self.weights /= w
            self.total /= w
            self.ref_s = at_s
            w = 1.0
        self.weights[i] += w
        self.total += w

    def percentile(self, q: float) -> float:
        """The ratio below which a share `q` of the (decayed) weight lies; 0 when empty."""
        if self.total <= 0:
            return 0.0
        cum = np.cumsum(self.weights)
        i = int(np.searchsorted(cum, q * cum[-1]))
        return float(BUCKET_TOP[min(i, N_BUCKETS - 1)])


@dataclass(slots=True)
class FamilyStats:
    """What history knows of one family."""

    count: int = 0  # finished attempts observed
    cpu: DecayingHistogram = field(default_factory=DecayingHistogram)  # avg cores / request
    mem: DecayingHistogram = field(default_factory=DecayingHistogram)  # peak / request
    runtime: DecayingHistogram = field(default_factory=DecayingHistogram)  # actual / declared
    last_runtimes: tuple[float, ...] = ()  # the last two runtime ratios, newest last
    ooms: int = 0  # OOM kills observed
    last_oom_s: float = -math.inf
    oom_limit: float = 0.0  # highest memory ratio at which a task of the family was killed

    def runtime_ratio(self) -> float:
        """Predicted runtime / declared: the mean of the last two observations (1 if none)."""
        if not self.last_runtimes:
            return 1.0
        return sum(self.last_runtimes) / len(self.last_runtimes)


@dataclass(frozen=True, slots=True)
class Measured:
    """One attempt's measured ratios, as computed from its end event."""

    cpu: float  # average cores used / cores requested
    mem: float  # peak memory / memory requested (after an OOM: the limit it hit / requested)
    runtime: float  # compute seconds x node speed / declared duration


def measured_ratios(
    duration_s: float,
    cpu_cores: float,
    mem_gb: float,
    speed: float,
    runtime_s: float,
    cpu_core_s: float,
    peak_mem_gb: float,
) -> Measured:
    """Ratios of an attempt's measurements to its task's declaration, on a node running its
    type at `speed` (advertised). Throttling (CPU reserved below use) shows as longer runs."""
    rt = max(runtime_s, 1e-9)
    return Measured(
        cpu=cpu_core_s / rt / cpu_cores,
        mem=peak_mem_gb / mem_gb,
        runtime=runtime_s * speed / duration_s,
    )


class History:
    """Decaying per-family statistics of measured outcomes."""

    def __init__(self) -> None:
        self.families: dict[str, FamilyStats] = {}
        # family -> (the stats summarised, their summary): a batch reads the same families
        # many times between two outcomes, and a summary costs five percentile reads
        self._summaries: dict[str, tuple[FamilyStats, FamilySummary]] = {}

    def get(self, family: str) -> FamilyStats | None:
        return self.families.get(family)

    def summary(self, family: str) -> FamilySummary | None:
        """`summarize(self.get(family))`, kept until the family's next outcome (or until
        `families` is replaced)."""
        stats = self.families.get(family)
        if stats is None:
            return None
        hit = self._summaries.get(family)
        if hit is not None and hit[0] is stats:
            return hit[1]
        out = summarize(stats)
        assert out is not None
        self._summaries[family] = (stats, out)
        return out

    def _stats(self, family: str) -> FamilyStats:
        s = self.families.get(family)
        if s is None:
            s = self.families[family] = FamilyStats()
        return s

    def finished(self, family: str, m: Measured, at_s: float) -> None:
        """A task of `family` finished with measured ratios `m` at `at_s`."""
        s = self._stats(family)
        self._summaries.pop(family, None)
        s.count += 1
        s.cpu.add(m.cpu, at_s)
        s.mem.add(m.mem, at_s)
        s.runtime.add(m.runtime, at_s)
        s.last_runtimes = (*s.last_runtimes[-1:], m.runtime)

    def oom(self, family: str, limit_ratio: float, at_s: float) -> None:
        """A task of `family` was OOM-killed at memory `limit_ratio` x its request."""
        s = self._stats(family)
        self._summaries.pop(family, None)
        s.ooms += 1
        s.last_oom_s = at_s
        s.oom_limit = max(s.oom_limit, limit_ratio)


@dataclass(frozen=True, slots=True)
class FamilySummary:
    """What a policy reads of a family's history: a few percentiles and counts."""

    count: int
    cpu_p50: float
    cpu_p90: float
    mem_p50: float
    mem_p90: float
    runtime_ratio: float  # the prediction: mean of the last two observed runtime ratios
    runtime_p90: float
    ooms: int
    oom_limit: float


def summarize(stats: FamilyStats | None) -> FamilySummary | None:
    """The summary of `stats`, None for a family never observed."""
    if stats is None:
        return None
    return FamilySummary(
        count=stats.count,
        cpu_p50=stats.cpu.percentile(0.5),
        cpu_p90=stats.cpu.percentile(0.9),
        mem_p50=stats.mem.percentile(0.5),
        mem_p90=stats.mem.percentile(0.9),
        runtime_ratio=stats.runtime_ratio(),
        runtime_p90=stats.runtime.percentile(0.9),
        ooms=stats.ooms,
        oom_limit=stats.oom_limit,
    )


OOM_BUMP = 1.2  # the VPA recommender's memory bump after an OOM kill
VPA_MARGIN = 1.15  # the VPA recommender's safety margin over its p90 target


def predicted_use(
    cpu_cores: float, mem_gb: float, h: FamilySummary | None, margin: float = 1.0
) -> tuple[float, float, float]:
    """(cores, memory GB, runtime ratio) history predicts for a task with this request: its
    family's p90 CPU use and memory peak x the request x `margin` (memory at least 1.2 x
    the highest limit an OOM kill of the family hit) and the runtime prediction; the
    declared request and ratio 1 while the family has no finished task."""
    if h is None:
        return cpu_cores, mem_gb, 1.0
    if h.count:
        cores, mem = cpu_cores * h.cpu_p90 * margin, mem_gb * h.mem_p90 * margin
        rt = h.runtime_ratio
    else:
        cores, mem, rt = cpu_cores, mem_gb, 1.0
    if h.ooms:
        mem = max(mem, mem_gb * h.oom_limit * OOM_BUMP)
    return cores, mem, rt
