"""The shifted world's effects on an attempt (`ShiftConfig`), applied by the engine.

Kept apart from the engine so the effects read in one place. The engine switches them on at
`ShiftConfig.at_s` (a `SHIFT` event) and then calls `shifted_start` for every attempt that
starts; the wider memory spread is drawn with the hidden truth when a workflow arrives
(`HiddenTruth.draw(mem_spread=...)`). Nothing here reaches a policy's view: an attempt's
restart shows only as a later finish, a neighbour's slowdown only as a longer measured run.
"""

from __future__ import annotations

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
