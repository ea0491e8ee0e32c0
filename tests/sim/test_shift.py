"""The shifted world: a long restart after an OOM kill, wider memory peaks, noisy neighbours;
switched on at `at_s`, deterministic, and invisible to a policy until outcomes show it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dagsched.core.observation import CLUSTER_FEATURES, NODE_FEATURES, Observation, observe
from dagsched.settings import load_settings
from dagsched.sim.config import PRODUCTION_SHIFT, ScenarioConfig, ShiftConfig, TruthConfig
from dagsched.sim.engine import AttemptRecord, Simulator
from dagsched.sim.runner import generate_workflows, make_policy
from dagsched.sim.runs import Decision, TaskRun
from dagsched.sim.snapshot import cluster_view, task_view
from dagsched.sim.truth import HiddenTruth
from tests.sim.conftest import small_scenario


def _run(sc: ScenarioConfig, policy: str = "heft", seed: int = 3) -> Simulator:
    sim = Simulator(sc, generate_workflows(sc, seed), seed=seed, keep_log=True)
    sim.run(make_policy(policy, seed))
    return sim


def _log(sim: Simulator) -> list[AttemptRecord]:
    assert sim.log is not None
    return sim.log


def test_the_shift_profile_is_documented_and_validated() -> None:
    shift = load_settings(profile="shift", environ={}).sim.shift
    assert shift == PRODUCTION_SHIFT  # the demo's shift when its profile sets none
    assert shift.oom_restart_s > 0 and shift.mem_spread >= 1
    assert load_settings(profile=None, environ={}).sim.shift is None
    # production runs below the training load (docs/concepts/world.md)
    assert load_settings(profile="shift", environ={}).sim.workload.load < 0.8
    for bad in (
        {"mem_spread": 0.5},
        {"oom_restart_s": -1.0},
        {"at_s": -1.0},
        {"release_every": 0.5},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            ShiftConfig(**bad)  # type: ignore[arg-type]


def test_a_neutral_or_later_shift_changes_nothing() -> None:
    sc = small_scenario(workflows=40)
    base = _run(sc)
    late = ShiftConfig(at_s=1e9, oom_restart_s=900, mem_spread=3, release_every=2)
    for shift in (ShiftConfig(), late):
        other = _run(replace(sc, shift=shift))
        assert other.summary() == base.summary()
        assert _log(other) == _log(base)


def test_the_retry_after_an_oom_kill_pays_the_restart_only_once_shifted() -> None:
    sc = small_scenario(workflows=60)  # heft reserves what tasks declare: ~7% peak above it
    restart = 500.0

    def setups(sim: Simulator) -> tuple[list[float], list[float]]:
        """Seconds from start to compute: attempts after an OOM kill, and all others."""
        log = _log(sim)
        oomed = {(r.wf_id, r.idx, r.attempt + 1) for r in log if r.outcome == "oom"}
        after, other = [], []
        for r in log:
            if r.outcome != "cancelled":
                (after if (r.wf_id, r.idx, r.attempt) in oomed else other).append(
                    r.compute_start_s - r.start_s
                )
        return after, other

    after, other = setups(_run(replace(sc, shift=ShiftConfig(oom_restart_s=restart))))
    assert after and min(after) >= restart
    assert max(other) < restart
    after0, _ = setups(_run(sc))
    assert after0 and max(after0) < restart


def test_memory_peaks_spread_wider_from_the_same_draws() -> None:
    truth = HiddenTruth(TruthConfig(), seed=1)
    (wf,) = generate_workflows(small_scenario(workflows=1), 1)
    fam = np.array([truth.family(t.family) for t in wf.tasks])
    plain = truth.draw(wf, np.random.default_rng(7))
    wide = truth.draw(wf, np.random.default_rng(7), mem_spread=2.0)
    assert np.allclose(plain[:, [0, 2]], wide[:, [0, 2]])  # CPU use and runtime as before
    ok = (wide[:, 1] > 0.02) & (wide[:, 1] < 4.0)  # not clipped
    assert ok.any()
    log_dev = np.log(plain[ok, 1] / fam[ok, 1])
    assert np.allclose(np.log(wide[ok, 1] / fam[ok, 1]), 2 * log_dev)


def test_wider_peaks_start_with_the_workflows_arriving_after_the_shift() -> None:
    sc = small_scenario(workflows=60)
    at = generate_workflows(sc, 3)[30].arrival_s
    peaks = {}
    for shift in (None, ShiftConfig(at_s=at, mem_spread=2.5)):
        sim = Simulator(replace(sc, shift=shift), generate_workflows(sc, 3), seed=3)
        seen: dict[str, list[float]] = {}
        sim.on_outcome = lambda t, o, r, seen=seen: seen.setdefault(t.run.wf.id, [t.peak_mem])
        sim.run(make_policy("least_loaded", 3))
        peaks[shift is None] = seen
    before = [w.id for w in generate_workflows(sc, 3) if w.arrival_s < at]
    after = [w.id for w in generate_workflows(sc, 3) if w.arrival_s > at]
    assert all(peaks[True][w] == peaks[False][w] for w in before if w in peaks[True])
    assert any(peaks[True][w] != peaks[False][w] for w in after if w in peaks[True])


def test_families_ship_new_releases_from_the_shift_on() -> None:
    sc = small_scenario(workflows=80)
    plain = generate_workflows(sc, 3)
    at = plain[20].arrival_s
    shifted = replace(sc, shift=ShiftConfig(at_s=at, release_every=5))
    wfs = generate_workflows(shifted, 3)
    assert wfs == generate_workflows(shifted, 3)  # decided on the workload's own stream
    released: dict[str, set[str]] = {}
    for a, b in zip(plain, wfs, strict=True):
        assert b.id == a.id and b.arrival_s == a.arrival_s
        for ta, tb in zip(a.tasks, b.tasks, strict=True):
            assert tb.family.split("@r")[0] == ta.family  # a release of the same family
            assert replace(tb, family=ta.family) == ta  # and nothing else changed
            if a.arrival_s < at:
                assert tb.family == ta.family
            released.setdefault(ta.family, set()).add(tb.family)
    # frequent families ship several releases, and a release stays until the next one
    assert max(len(r) for r in released.values()) >= 3
    for fam in released:
        ks = [
            int(t.family.partition("@r")[2] or 0)
            for w in wfs
            for t in w.tasks
            if t.family.split("@r")[0] == fam
        ]
        assert ks == sorted(ks)
    # the hidden truth draws a release afresh: history of the old name does not apply
    truth = HiddenTruth(TruthConfig(), seed=3)
    fam = max(released, key=lambda f: len(released[f]))
    medians = {truth.family(r) for r in released[fam]}
    assert len(medians) == len(released[fam])


def test_noisy_neighbours_slow_tasks_on_busy_nodes() -> None:
    sc = small_scenario(workflows=40, exact=True, transient=0.0, node_failure_per_hour=0.0)

    def slowdowns(sim: Simulator) -> list[float]:
        wfs = {w.id: w for w in generate_workflows(sc, 3)}
        out = []
        for r in _log(sim):
            if r.outcome == "done":
                spec = wfs[r.wf_id].tasks[r.idx]
                advertised = spec.duration_s / sim.cluster.speed[r.node, spec.type]
                out.append(r.runtime_s / (advertised * max(1.0, spec.cpu_cores / r.res_cores)))
        return out

    quiet = slowdowns(_run(sc, "least_loaded"))
    assert np.allclose(quiet, 1.0)
    noisy = slowdowns(_run(replace(sc, shift=ShiftConfig(neighbour_slowdown=1.0)), "least_loaded"))
    assert min(noisy) >= 1.0 - 1e-9 and max(noisy) <= 2.0 + 1e-9
    assert sum(x > 1.05 for x in noisy) > len(noisy) // 4


def test_a_shifted_run_is_deterministic() -> None:
    sc = replace(
        small_scenario(workflows=40),
        shift=ShiftConfig(at_s=500.0, oom_restart_s=300, mem_spread=2, neighbour_slowdown=0.5),
    )
    a, b = _run(sc), _run(sc)
    assert a.summary() == b.summary() and _log(a) == _log(b)
    assert a.shifted_at == 500.0


class _Recorder:
    """least_loaded, recording the observation of every decision and when outcomes began."""

    name = "recorder"

    def __init__(self) -> None:
        self.inner = make_policy("least_loaded", 0)
        self.seen: list[tuple[float, Observation]] = []
        self.first_outcome = float("inf")

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        view = cluster_view(sim)
        self.seen += [(sim.now, observe(view, task_view(t, sim))) for t in ready]
        return self.inner.decide(sim, ready)


def _observed(shift: ShiftConfig | None) -> _Recorder:
    sc = replace(small_scenario(nodes=32, workflows=30, load=1.5), shift=shift)
    rec = _Recorder()
    sim = Simulator(sc, generate_workflows(sc, 4), seed=4)

    def outcome(t: TaskRun, *_: object) -> None:
        rec.first_outcome = min(rec.first_outcome, sim.now)

    sim.on_outcome = outcome
    sim.run(rec)
    return rec


TELEMETRY = (
    [NODE_FEATURES.index("mem_really_used")],
    [CLUSTER_FEATURES.index("mem_really_used_mean")],
)


def _same_before_outcomes(shift: ShiftConfig, telemetry: bool) -> None:
    """Every decision before the first outcome of either run sees the same observation (but
    for what nodes measure of their real memory use, unless `telemetry`)."""
    plain, shifted = _observed(None), _observed(shift)
    horizon = min(plain.first_outcome, shifted.first_outcome)
    before = [(a, b) for a, b in zip(plain.seen, shifted.seen, strict=False) if a[0] < horizon]
    assert len(before) >= 10
    for (ta, a), (tb, b) in before:
        assert ta == tb
        nodes, cluster = a.nodes.copy(), a.cluster.copy()
        if not telemetry:
            nodes[:, TELEMETRY[0]] = b.nodes[:, TELEMETRY[0]]
            cluster[TELEMETRY[1]] = b.cluster[TELEMETRY[1]]
        assert np.array_equal(nodes, b.nodes) and np.array_equal(cluster, b.cluster)
        for f in ("mask", "dag", "edges", "base", "base_logits"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), f
    # once outcomes arrive, the shifted world shows (in history, node slowdowns, queues)
    assert any(
        not np.array_equal(a.nodes, b.nodes)
        for (_, a), (_, b) in zip(plain.seen, shifted.seen, strict=False)
    )


def test_restarts_and_neighbours_are_invisible_until_outcomes_arrive() -> None:
    _same_before_outcomes(ShiftConfig(oom_restart_s=900, neighbour_slowdown=2), telemetry=True)


def test_wider_peaks_show_only_in_measured_memory_use_before_outcomes() -> None:
    """A node agent reports the memory its tasks really use (the simulator counts an attempt's
    mean use from its start): a measurement, as outcomes are; nothing else differs."""
    _same_before_outcomes(ShiftConfig(oom_restart_s=900, mem_spread=3), telemetry=False)
