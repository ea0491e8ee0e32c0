"""The shifted world's effects on an attempt (`ShiftConfig`), applied by the engine.

Kept apart from the engine so the effects read in one place. The engine switches them on at
`ShiftConfig.at_s` (a `SHIFT` event) and then calls `shifted_start` for every attempt that
starts; the wider memory spread is drawn with the hidden truth when a workflow arrives
(`HiddenTruth.draw(mem_spread=...)`). `Releases` renames a submitted workflow's families
that shipped a new release; the job queue applies it (`sim.runner.released`), so what a
policy, a recorder or a replay sees is the released workflow. Nothing here reaches a
policy's view but the new names: an attempt's restart shows only as a later finish, a
neighbour's slowdown only as a longer measured run, a release only as a family that
history has never seen.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from dagsched.core.workflow import Workflow
from dagsched.sim.config import ShiftConfig
from dagsched.sim.runs import TaskRun


def shifted_start(cfg: ShiftConfig, t: TaskRun, others_used_cores: float, cores: float) -> None:
    """Adjust attempt `t`, starting now, for the shift: after an OOM kill of its previous
    attempt it first restarts for `oom_restart_s` (holding its reservation); on a node whose
    other attempts really use a share `u` of its `cores` it computes
    `1 + neighbour_slowdown x u` times slower."""
    if t.after_oom and cfg.oom_restart_s > 0:
        t.compute_start_s += cfg.oom_restart_s
    if cfg.neighbour_slowdown > 0 and others_used_cores > 0:
        u = min(1.0, others_used_cores / cores)
        t.compute_s *= 1.0 + cfg.neighbour_slowdown * u


class Releases:
    """New releases of task families (`ShiftConfig.release_every`): each family of an
    arriving workflow ships a new release with probability `1 / release_every`, decided once
    per workflow, and keeps its release until the next one. A family at release k > 0 is
    named `family@rk`; the hidden truth draws a renamed family's ratios afresh (its medians
    are seeded by the name), so a release behaves unlike what history measured."""

    def __init__(self, rng: np.random.Generator) -> None:
        self._rng = rng
        self._release: dict[str, int] = {}

    def apply(self, wf: Workflow, release_every: float) -> Workflow:
        """`wf` with its families at their current release, after this arrival's draws."""
        p = 1.0 / release_every
        names: dict[str, str] = {}
        for fam in dict.fromkeys(t.family for t in wf.tasks):
            k = self._release.get(fam, 0) + (self._rng.random() < p)
            self._release[fam] = k
            names[fam] = f"{fam}@r{k}" if k else fam
        if all(new == old for old, new in names.items()):
            return wf
        tasks = [replace(t, family=names[t.family]) for t in wf.tasks]
        return replace(wf, tasks=tasks)
