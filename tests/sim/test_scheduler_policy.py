"""The scheduler contract: views from the simulator, the heuristic fallback, the adapter."""

from __future__ import annotations

from dagsched.policy.heuristic import LeastLoadedScheduler
from dagsched.sim.runner import simulate
from dagsched.sim.snapshot import SchedulerPolicy
from tests.sim.conftest import small_scenario


def test_fallback_matches_the_simulator_baseline() -> None:
    """Same rule through views as the simulator's own least-loaded: same results."""
    sc = small_scenario(workflows=25)
    via_views = simulate(sc, SchedulerPolicy(LeastLoadedScheduler()), seed=2)
    native = simulate(sc, "least_loaded", seed=2)
    for key in ("sla_attainment", "tasks", "decisions", "mean_jct_s"):
        assert via_views[key] == native[key]
    assert via_views["policy"] == "heuristic:least_loaded"
