"""Running a scenario: the steady-state metrics over the arrivals after a warm-up."""

from __future__ import annotations

import pytest

from dagsched.sim.runner import simulate, steady_state
from tests.sim.conftest import small_scenario


def test_steady_state_counts_only_the_arrivals_after_the_warmup() -> None:
    sc = small_scenario(workflows=60)
    whole = simulate(sc, "heft", seed=3)
    all_counted = steady_state(sc, "heft", seed=3)
    for k in ("sla_attainment", "mean_jct_s", "workflows_failed", "oom_kills"):
        assert all_counted[k] == pytest.approx(whole[k])  # the same definitions
    late = steady_state(sc, "heft", seed=3, warmup=30)
    assert late["oom_kills"] == whole["oom_kills"]  # the same run
    assert late["workflows_failed"] < whole["workflows_failed"]
    assert late["mean_jct_s"] != pytest.approx(whole["mean_jct_s"])
    with pytest.raises(ValueError, match="warmup"):
        steady_state(sc, "heft", seed=3, warmup=60)
