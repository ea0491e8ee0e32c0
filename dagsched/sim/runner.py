"""One call to run a scenario with a named policy and get its metrics (CLI, bench, tests)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dagsched.core.workflow import Workflow
from dagsched.sim.baselines import HEFT_HISTORY_RULES, make_baseline
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.replay_world import WorkflowEnds
from dagsched.sim.runs import Policy
from dagsched.sim.shift import Releases
from dagsched.sim.workload import WorkloadGenerator, arrival_rate, retime

POLICY_NAMES: tuple[str, ...] = (
    "random",
    "round_robin",
    "first_fit",
    "least_loaded",
    "sjf",
    "tetris",
    "heft",
    *HEFT_HISTORY_RULES,
)

# Independent random streams per concern, so changing the policy never changes the workload.
_WORKLOAD, _POLICY, _PILOT, _RELEASES = 1, 2, 3, 4

PILOT_WORKFLOWS = 200


def rng_for(seed: int, stream: int) -> np.random.Generator:
    """The generator of one named stream of a run."""
    return np.random.default_rng(np.random.SeedSequence([seed, stream]))


def generate_workflows(scenario: ScenarioConfig, seed: int, n: int | None = None) -> list[Workflow]:
    """The scenario's workload for `seed`: `n` (default from config) workflows with arrivals."""
    gen = WorkloadGenerator(
        scenario.workload, scenario.cluster, rng_for(seed, _WORKLOAD), scenario.truth
    )
    return list(released(scenario, seed, gen.generate(n)))


def stream_workflows(scenario: ScenarioConfig, seed: int, n: int) -> Iterator[Workflow]:
    """`n` workflows generated lazily, so memory stays flat however long the run.

    The arrival rate comes from a pilot sample of the same generator settings.
    """
    pilot = WorkloadGenerator(
        scenario.workload, scenario.cluster, rng_for(seed, _PILOT), scenario.truth
    )
    rate = arrival_rate(
        scenario.workload.load, scenario.cluster, pilot.generate(PILOT_WORKFLOWS), scenario.truth
    )
    rng = rng_for(seed, _WORKLOAD)
    gen = WorkloadGenerator(scenario.workload, scenario.cluster, rng, scenario.truth)

    def arrivals() -> Iterator[Workflow]:
        t = 0.0
        for i in range(n):
            t += float(rng.exponential(1.0 / rate))
            yield gen.make_workflow(f"wf-{i:07d}", arrival_s=t)

    yield from released(scenario, seed, arrivals())


def released(scenario: ScenarioConfig, seed: int, wfs: Iterable[Workflow]) -> Iterator[Workflow]:
    """`wfs` as the job queue submits them in the scenario's shifted world: with the shift's
    `release_every`, the families of workflows arriving from its `at_s` on are at their
    current release (`sim.shift.Releases`); otherwise unchanged. Releases are decided on the
    workflows' own stream, so every policy meets the same ones."""
    shift = scenario.shift
    if shift is None or not shift.release_every:
        yield from wfs
        return
    releases = Releases(rng_for(seed, _RELEASES))
    for wf in wfs:
        yield releases.apply(wf, shift.release_every) if wf.arrival_s >= shift.at_s else wf


def make_policy(name: str, seed: int) -> Policy:
    """A baseline policy by name, with its own random stream."""
    if name not in POLICY_NAMES:
        raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICY_NAMES)}")
    return make_baseline(name, rng_for(seed, _POLICY))


def simulate(
    scenario: ScenarioConfig,
    policy: str | Policy,
    *,
    seed: int = 0,
    workflows: Sequence[Workflow] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Run `scenario` under `policy`; return the metrics (see `dagsched.sim.metrics`).

    `workflows` replaces the generated workload (e.g. WfFormat imports; their arrivals are
    re-timed to the scenario's load). `progress(done, total)` is called as workflows end.
    """
    pol = make_policy(policy, seed) if isinstance(policy, str) else policy
    if workflows is None:
        wfs = generate_workflows(scenario, seed)
    else:
        wfs = _unique_ids(list(workflows))
        rate = arrival_rate(scenario.workload.load, scenario.cluster, wfs, scenario.truth)
        wfs = retime(wfs, rate, rng_for(seed, _WORKLOAD))
    total = len(wfs)
    started = time.perf_counter()
    sim = Simulator(scenario, wfs, seed=seed)
    out = sim.run(pol, progress=(lambda n: progress(n, total)) if progress else None)
    return {"policy": pol.name, "seed": seed, **out, "wall_s": time.perf_counter() - started}


def steady_state(
    scenario: ScenarioConfig, policy: str | Policy, *, seed: int = 0, warmup: int = 0
) -> dict[str, float]:
    """SLA attainment, mean JCT (of the workflows that completed) and failed workflows over
    the arrivals after the first `warmup` of one run of `scenario` (steady state: the
    cluster and the history are no longer empty), and the whole run's OOM kills."""
    pol = make_policy(policy, seed) if isinstance(policy, str) else policy
    wfs = generate_workflows(scenario, seed)
    if not 0 <= warmup < len(wfs):
        raise ValueError(f"warmup must be in [0, {len(wfs)}), got {warmup}")
    ends = WorkflowEnds(frozenset(w.id for w in wfs[warmup:]))
    sim = Simulator(scenario, wfs, seed=seed, on_outcome=ends)
    ends.sim = sim
    out = sim.run(pol)
    r = ends.result
    done = [j for i, j in r.jct_s.items() if i not in r.failed]  # as `Metrics` counts JCT
    return {
        "sla_attainment": r.sla,
        "mean_jct_s": float(np.mean(done)) if done else 0.0,
        "workflows_failed": float(len(r.failed)),
        "oom_kills": float(out["oom_kills"]),
    }


def _unique_ids(wfs: list[Workflow]) -> list[Workflow]:
    """Imported workflows may share names; suffix repeats so ids stay unique."""
    seen: dict[str, int] = {}
    out = []
    for wf in wfs:
        k = seen.get(wf.id, 0)
        seen[wf.id] = k + 1
        out.append(wf if k == 0 else replace(wf, id=f"{wf.id}#{k}"))
    return out
