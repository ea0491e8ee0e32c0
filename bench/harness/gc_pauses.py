"""Garbage-collection pauses of this process while a bench measures (`daemon_profile.py`,
`daemon_stalls.py`): how many collections, in total and the longest, per generation."""

from __future__ import annotations

import gc
import time
from typing import Any


class GcPauses:
    """Times every collection between `__enter__` and `__exit__` (gc.callbacks)."""

    def __init__(self) -> None:
        self.pauses: list[tuple[int, float]] = []  # (generation, seconds)
        self._began = 0.0

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append((info["generation"], time.perf_counter() - self._began))

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._on_gc)

    def show(self) -> None:
        for g in (0, 1, 2):
            ts = [t for gen, t in self.pauses if gen == g]
            if ts:
                print(
                    f"  gc gen{g}: {len(ts)} runs, {sum(ts) * 1000:.1f} ms, "
                    f"max {max(ts) * 1000:.2f} ms"
                )
