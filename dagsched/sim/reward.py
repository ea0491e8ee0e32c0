"""The per-decision reward, shared by the simulator and the online learner.

Each term is a penalty in [-1, 0] (the deadline term is unbounded below: it grows linearly
with lateness) so the weights in config read as priorities:

| term       | value                                                                       |
|------------|-----------------------------------------------------------------------------|
| deadline   | -(lateness past the task's sub-deadline) / workflow deadline; -1 extra on failure |
| cost       | -min(reserved core-s / ideal core-s, 4) / 4  (ideal = demand x reference time)  |
| fairness   | Jain index of node CPU reservations at decision time, minus 1               |
| stability  | -1 when the attempt runs on another node than the previous one (migration)  |
| network    | -transfer time / (transfer + compute time) of the attempt                  |
"""

from __future__ import annotations

from dataclasses import dataclass

from dagsched.sim.config import RewardWeights

COST_RATIO_CAP = 4.0


@dataclass(slots=True)
class TaskOutcome:
    """What happened to one placed attempt; everything the reward needs."""

    lateness: float  # seconds past the sub-deadline / workflow deadline, >= 0
    failed: bool
    reserved_core_s: float
    ideal_core_s: float
    jain_at_decision: float
    migrated: bool
    transfer_s: float
    compute_s: float


def reward_terms(o: TaskOutcome) -> dict[str, float]:
    """The unweighted terms, keyed like `RewardWeights`."""
    ratio = o.reserved_core_s / o.ideal_core_s if o.ideal_core_s > 0 else COST_RATIO_CAP
    busy = o.transfer_s + o.compute_s
    return {
        "deadline": -max(0.0, o.lateness) - (1.0 if o.failed else 0.0),
        "cost": -min(ratio, COST_RATIO_CAP) / COST_RATIO_CAP,
        "fairness": min(1.0, max(0.0, o.jain_at_decision)) - 1.0,
        "stability": -1.0 if o.migrated else 0.0,
        "network": -(o.transfer_s / busy) if busy > 0 else 0.0,
    }


def decision_reward(o: TaskOutcome, w: RewardWeights) -> float:
    """Weighted sum of the reward terms for one attempt (same as summing `reward_terms`)."""
    # Written out rather than via reward_terms(): this runs once per simulated attempt.
    ratio = o.reserved_core_s / o.ideal_core_s if o.ideal_core_s > 0 else COST_RATIO_CAP
    busy = o.transfer_s + o.compute_s
    jain = o.jain_at_decision
    return (
        -w.deadline * ((o.lateness if o.lateness > 0 else 0.0) + (1.0 if o.failed else 0.0))
        - w.cost * (ratio if ratio < COST_RATIO_CAP else COST_RATIO_CAP) / COST_RATIO_CAP
        + w.fairness * ((jain if jain < 1.0 else 1.0) - 1.0 if jain > 0 else -1.0)
        - (w.stability if o.migrated else 0.0)
        - (w.network * o.transfer_s / busy if busy > 0 else 0.0)
    )
