"""What a placement may ask for, and the one clamp every part applies to it.

Reservations are fractions of the chosen node: CPU 0.1-0.9 and memory 0.2-0.8; retries 1-5;
a policy's priority 0-1. The simulator, the daemon and the policy's action decoding all clamp
with `clamp_placement` (or the same bounds as arrays, `ACTION_LOW` / `ACTION_HIGH`), so an
out-of-range answer means the same thing wherever it is played.

The policy's continuous head draws each value in a unit interval that reaches a little past
the bounds (`UNIT_LOW`, `UNIT_SPAN`: `UNIT_MARGIN` of the span each side), so that a value
at a bound - a small task's CPU reservation at 0.1 - is an interior point of its Beta
distribution, which the head can move away from in either direction.
"""

from __future__ import annotations

import numpy as np

CPU_BOUNDS = (0.1, 0.9)
MEM_BOUNDS = (0.2, 0.8)
RETRY_BOUNDS = (1, 5)
# what a policy's priority head may answer (the wire takes any finite float, higher first)
PRIORITY_BOUNDS = (0.0, 1.0)

_CPU_LO, _CPU_HI = CPU_BOUNDS
_MEM_LO, _MEM_HI = MEM_BOUNDS
_RETRY_LO, _RETRY_HI = RETRY_BOUNDS

# the continuous action (CPU, memory, retries, priority) as arrays, for vectorised decoding
ACTION_NAMES = ("cpu", "mem", "max_retries", "priority")
ACTION_LOW = np.array([_CPU_LO, _MEM_LO, _RETRY_LO, PRIORITY_BOUNDS[0]], dtype=np.float32)
ACTION_HIGH = np.array([_CPU_HI, _MEM_HI, _RETRY_HI, PRIORITY_BOUNDS[1]], dtype=np.float32)
ACTION_SPAN = ACTION_HIGH - ACTION_LOW
UNIT_MARGIN = 0.05
UNIT_LOW = (ACTION_LOW - UNIT_MARGIN * ACTION_SPAN).astype(np.float32)
UNIT_SPAN = ((1 + 2 * UNIT_MARGIN) * ACTION_SPAN).astype(np.float32)


def to_unit(values: np.ndarray) -> np.ndarray:
    """Action values [..., 4] in the continuous head's unit space (float32)."""
    return ((np.asarray(values, dtype=np.float64) - UNIT_LOW) / UNIT_SPAN).astype(np.float32)


def clamp_action(values: np.ndarray) -> np.ndarray:
    """Action values [..., 4] clamped to their bounds."""
    return np.clip(values, ACTION_LOW, ACTION_HIGH)


def clamp_placement(cpu: float, mem: float, retries: float) -> tuple[float, float, int]:
    """(CPU fraction, memory fraction, max retries) within their bounds; retries rounded."""
    cpu = _CPU_LO if cpu < _CPU_LO else _CPU_HI if cpu > _CPU_HI else float(cpu)
    mem = _MEM_LO if mem < _MEM_LO else _MEM_HI if mem > _MEM_HI else float(mem)
    n = round(retries)
    return cpu, mem, _RETRY_LO if n < _RETRY_LO else _RETRY_HI if n > _RETRY_HI else int(n)
