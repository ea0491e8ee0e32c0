"""The per-decision reward, shared by the simulator and the online learner.

Each term is a penalty (<= 0) so the weights in config read as priorities:

| term       | value                                                                       |
|------------|-----------------------------------------------------------------------------|
| deadline   | -(lateness past the task's sub-deadline) / workflow deadline; -1 extra on failure |
| cost       | -min(reserved / ideal, 4) / 4, both in dominant-share core-seconds (below)  |
| fairness   | Jain index of node CPU reservations with this decision's own taken, minus 1 |
| stability  | -1 when the attempt runs on another node than the previous one (migration)  |
| network    | -transfer time / (transfer + compute time) of the attempt                  |
| completion | -(workflow-seconds spent in the system since the previous decision) / 100 s |

Cost counts memory as well as cores: an attempt's reservation is its dominant share of the
node (max of the CPU and memory fractions) x the node's cores x the seconds it was held;
ideal is the declared request's dominant share on that node x its cores x the declared
duration at reference speed. Reserving less than declared (right-sizing) therefore pays.

Completion is Decima's time-in-system term (Mao et al., SIGCOMM 2019): between consecutive
decisions, the time that passed times the workflows in the system. Decima charges it to the
earlier decision; here it is charged to the later one, so that every attempt's reward is
known when the attempt ends (under discounting with gamma near 1 the one-step shift changes
little). Over a run the terms sum to minus the time workflows spent in the system up to the
last decision (/ 100 s), so maximising it minimises mean completion time. A workflow that
fails is charged as if it stayed until its deadline (or until it failed, if later), so giving
up early never pays; its cancelled attempts are failures (deadline term -1 each).
"""

from __future__ import annotations

from dataclasses import dataclass

from dagsched.sim.config import RewardWeights

COST_RATIO_CAP = 4.0
COMPLETION_SCALE_S = 100.0


@dataclass(slots=True)
class TaskOutcome:
    """What happened to one placed attempt; everything the reward needs."""

    lateness: float  # seconds past the sub-deadline / workflow deadline, >= 0
    failed: bool
    reserved_core_s: float  # dominant-share core-seconds held
    ideal_core_s: float  # dominant-share core-seconds of the declared request
    jain_at_decision: float  # with the decision's own reservation taken
    migrated: bool
    transfer_s: float
    compute_s: float
    completion_wf_s: float = 0.0  # workflow-seconds charged to this decision (see above)


def dominant_core_s(cpu: float, mem: float, node_cores: float, seconds: float) -> float:
    """Core-seconds of holding fractions (`cpu`, `mem`) of a node for `seconds`: the dominant
    share x the node's cores."""
    return (cpu if cpu > mem else mem) * node_cores * seconds


def jain_with(sum_x: float, sum_x2: float, n: int, old: float, new: float) -> float:
    """Jain's index of n values with sum `sum_x` and sum of squares `sum_x2`, after one value
    changes from `old` to `new` (1 when all are zero)."""
    s = sum_x + new - old
    s2 = sum_x2 + new * new - old * old
    return 1.0 if s2 <= 1e-12 else min(1.0, s * s / (n * s2))


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
        "completion": -o.completion_wf_s / COMPLETION_SCALE_S,
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
        - w.completion * o.completion_wf_s / COMPLETION_SCALE_S
    )
