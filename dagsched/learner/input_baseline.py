"""Input-driven baselines (Mao et al., ICLR 2019, "Variance Reduction for Reinforcement
Learning in Input-Driven Environments"; Decima trains with them).

In a scheduler's world most of the variance of a return comes from the input - which
workflows arrive, and when - not from the actions. So several rollouts play the same arrival
sequence (the same workload and world seed; only the policy's sampled actions differ), and a
decision's baseline is what the *other* rollouts on that sequence collected from the same
moment on: the mean of their returns-to-go at the decision's time. What is left in the
advantage is what the actions changed.

Returns-to-go are undiscounted sums over the rest of the episode (an episode is a finite
number of workflows, and the completion term makes the sum track total time in system), and
they are read by simulated time, not by decision index: two rollouts decide different
numbers of tasks by the same instant.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def returns_to_go(rewards: np.ndarray) -> np.ndarray:
    """Per decision, the sum of its own and every later decision's reward."""
    return np.cumsum(np.asarray(rewards, dtype=np.float64)[::-1])[::-1].copy()


def return_at(times: np.ndarray, rtg: np.ndarray, at: np.ndarray) -> np.ndarray:
    """A rollout's return-to-go at each instant of `at`: the return of its first decision
    made at or after that instant (0 past its last decision). `times` ascending."""
    k = np.searchsorted(times, at, side="left")
    padded = np.append(rtg, 0.0)
    return padded[k]


def input_driven_advantages(
    times: Sequence[np.ndarray], rewards: Sequence[np.ndarray]
) -> list[np.ndarray]:
    """Advantages of K >= 2 rollouts of one arrival sequence: per rollout, its returns-to-go
    minus the mean of the other rollouts' returns-to-go at the same decision times.

    `times[i]` are rollout i's decision times (ascending) and `rewards[i]` their rewards."""
    k = len(times)
    if k < 2:
        raise ValueError("an input-driven baseline needs at least two rollouts per sequence")
    rtg = [returns_to_go(r) for r in rewards]
    out = []
    for i in range(k):
        at = np.asarray(times[i], dtype=np.float64)
        others = [return_at(np.asarray(times[j]), rtg[j], at) for j in range(k) if j != i]
        out.append(rtg[i] - np.mean(others, axis=0))
    return out
