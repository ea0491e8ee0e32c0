"""Run a grid of (policy, seed) simulations, inline or in a process pool."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from typing import Any

from dagsched.cli.console import ProgressFn
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import simulate


def simulate_one(scenario: ScenarioConfig, policy: str, seed: int) -> dict[str, Any]:
    """One run, with `policy` and `seed` recorded in its metrics (a pool worker's job)."""
    metrics = dict(simulate(scenario, policy, seed=seed))
    metrics.setdefault("policy", policy)
    metrics.setdefault("seed", seed)
    return metrics


def run_grid(
    scenario: ScenarioConfig,
    policies: Sequence[str],
    seeds: Sequence[int],
    *,
    jobs: int = 1,
    progress: ProgressFn | None = None,
) -> list[dict[str, Any]]:
    """Metrics of every (policy, seed), ordered by policy then seed whatever the finish order.

    With `jobs > 1` runs go to a pool of spawned processes (no fork under live threads such as
    a progress bar's); the first failure cancels the runs not yet started and is re-raised.
    """
    grid = [(p, s) for p in policies for s in seeds]
    total = len(grid)
    report = progress or (lambda done, total: None)
    report(0, total)
    if jobs <= 1 or total <= 1:
        results = []
        for i, (policy, seed) in enumerate(grid, 1):
            results.append(simulate_one(scenario, policy, seed))
            report(i, total)
        return results

    by_cell: dict[tuple[str, int], dict[str, Any]] = {}
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(jobs, total), mp_context=ctx) as pool:
        futures: dict[Future[dict[str, Any]], tuple[str, int]] = {
            pool.submit(simulate_one, scenario, p, s): (p, s) for p, s in grid
        }
        try:
            for done, fut in enumerate(as_completed(futures), 1):
                by_cell[futures[fut]] = fut.result()
                report(done, total)
        except BaseException:
            for fut in futures:
                fut.cancel()
            raise
    return [by_cell[cell] for cell in grid]
