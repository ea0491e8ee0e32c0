"""What a placement may ask for, and the one clamp every part applies to it.

Reservations are fractions of the chosen node: CPU 0.1-0.9 and memory 0.2-0.8; retries 1-5.
The simulator, the daemon and the policy's action decoding all clamp with `clamp_placement`
(or the same bounds as arrays, `ACTION_LOW` / `ACTION_HIGH`), so an out-of-range answer means
the same thing wherever it is played.
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

# the continuous action (CPU, memory, retries) as arrays, for vectorised decoding
ACTION_LOW = np.array([_CPU_LO, _MEM_LO, _RETRY_LO], dtype=np.float32)
ACTION_HIGH = np.array([_CPU_HI, _MEM_HI, _RETRY_HI], dtype=np.float32)
ACTION_SPAN = ACTION_HIGH - ACTION_LOW


def clamp_placement(cpu: float, mem: float, retries: float) -> tuple[float, float, int]:
    """(CPU fraction, memory fraction, max retries) within their bounds; retries rounded."""
    cpu = _CPU_LO if cpu < _CPU_LO else _CPU_HI if cpu > _CPU_HI else float(cpu)
    mem = _MEM_LO if mem < _MEM_LO else _MEM_HI if mem > _MEM_HI else float(mem)
    n = round(retries)
    return cpu, mem, _RETRY_LO if n < _RETRY_LO else _RETRY_HI if n > _RETRY_HI else int(n)
