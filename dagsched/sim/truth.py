"""Hidden truth: what tasks really use and how long they really run, per family and per task.

Declared is not actual. A task's request (`TaskSpec.cpu_cores`, `mem_gb`) and runtime
estimate (`duration_s`) are what its submitter wrote; the simulator runs it on the truth
drawn here. Only the engine reads it: policies learn it from measured outcomes
(`task_finished` / `task_failed`, and `core.history` built from them), never from here.

Each family (a recurring kind of task, `TaskSpec.family`) has median ratios drawn once per
run from the run's seed and the family's name, so a family behaves alike in every workflow
of the run, whatever order workflows arrive in; each task then draws its own ratios around
its family's. See `TruthConfig` for the defaults and their sources.
"""

from __future__ import annotations

import math
import zlib
from typing import Protocol

import numpy as np

from dagsched.core.workflow import Workflow
from dagsched.sim.config import TruthConfig

# Clip ratios to a sane range: a task never uses more than 4x or less than 2% of its request.
RATIO_BOUNDS = (0.02, 4.0)
RUNTIME_BOUNDS = (0.05, 20.0)


class TruthModel(Protocol):
    """What the engine asks of a world's truth: every task's real ratios on arrival."""

    def draw(self, wf: Workflow, rng: np.random.Generator, mem_spread: float = 1.0) -> np.ndarray:
        """[n, 3] ratios (CPU use, memory peak, runtime) for the tasks of `wf`."""
        ...


class HiddenTruth:
    """Per-family medians and per-task draws of the CPU use, memory peak and runtime ratios."""

    def __init__(self, cfg: TruthConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self._families: dict[str, tuple[float, float, float]] = {}
        self._median = np.array((cfg.cpu_use_median, cfg.mem_peak_median, cfg.runtime_median))
        self._family_sigma = np.array(
            (cfg.cpu_use_family_sigma, cfg.mem_peak_family_sigma, cfg.runtime_family_sigma)
        )
        self._task_sigma = np.array(
            (cfg.cpu_use_task_sigma, cfg.mem_peak_task_sigma, cfg.runtime_task_sigma)
        )

    def family(self, name: str) -> tuple[float, float, float]:
        """The family's median (CPU use, memory peak, runtime) ratios."""
        got = self._families.get(name)
        if got is None:
            if self.cfg.exact:
                got = (1.0, 1.0, 1.0)
            else:
                rng = np.random.default_rng([self.seed, zlib.crc32(name.encode())])
                m = self._median * np.exp(rng.normal(0.0, 1.0, 3) * self._family_sigma)
                got = (float(m[0]), float(m[1]), float(m[2]))
            self._families[name] = got
        return got

    def draw(self, wf: Workflow, rng: np.random.Generator, mem_spread: float = 1.0) -> np.ndarray:
        """[n, 3] ratios (CPU use, memory peak, runtime) for every task of `wf`; `mem_spread`
        multiplies the memory peak's task spread (a shift, `ShiftConfig.mem_spread`) from
        the same draws, so a shifted run keeps every other ratio of the unshifted one."""
        n = wf.size
        if self.cfg.exact:
            return np.ones((n, 3))
        fam = np.array([self.family(t.family) for t in wf.tasks])
        sigma = self._task_sigma
        if mem_spread != 1.0:
            sigma = sigma * np.array((1.0, mem_spread, 1.0))
        out = fam * np.exp(rng.normal(0.0, 1.0, (n, 3)) * sigma)
        np.clip(out[:, :2], *RATIO_BOUNDS, out=out[:, :2])
        np.clip(out[:, 2], *RUNTIME_BOUNDS, out=out[:, 2])
        return out


def expected_ratios(cfg: TruthConfig) -> tuple[float, float, float]:
    """Population means of the (CPU use, memory peak, runtime) ratios: lognormal means
    median x exp(sigma^2 / 2) over the family and task spreads (clipping ignored)."""
    if cfg.exact:
        return 1.0, 1.0, 1.0

    def mean(median: float, *sigmas: float) -> float:
        return median * math.exp(sum(s * s for s in sigmas) / 2)

    return (
        mean(cfg.cpu_use_median, cfg.cpu_use_family_sigma, cfg.cpu_use_task_sigma),
        mean(cfg.mem_peak_median, cfg.mem_peak_family_sigma, cfg.mem_peak_task_sigma),
        mean(cfg.runtime_median, cfg.runtime_family_sigma, cfg.runtime_task_sigma),
    )
