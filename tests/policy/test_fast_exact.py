"""The served fast path (`fast_place`, numpy) decides as the plain forward pass does, task by
task: on batches recorded from the simulator (busy clusters, family histories, placed parents,
retries, dead nodes), at 8, 32, 256 and 1,024 nodes, for the shipped champion and a randomly
initialised model.

Per task, in order: the fast path's observation equals `observe` on the view with the
earlier placements taken, bit for bit; the plain forward pass (`place_observations`, torch,
one task) on that observation picks the same node, the same retries, reservations and unit
values within 1e-5, the same log-probability within 1e-3 (torch's float32 rounding
of its lgammas, `LOGP_TOL`) and the same value within 1e-4.
A map stage's siblings (one workflow, one state) share one DAG encoding in the fast path and
still decide as their own forward passes do. Sampling: the log-probability the fast path
gives its sampled action is the model's `evaluate` of that action.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from dagsched.core.bounds import MEM_BOUNDS
from dagsched.core.heft import heft_order
from dagsched.core.history import FamilySummary
from dagsched.core.observation import Observation, observe
from dagsched.core.view import ClusterView, TaskView, map_stage
from dagsched.policy.bundle import load_bundle
from dagsched.policy.collate import collate
from dagsched.policy.model import ActorCritic, evaluate
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.numpy_net import Encodings
from dagsched.policy.scheduler import GNNScheduler
from dagsched.policy.vectorised_observation import DagCache
from dagsched.sim.config import FaultConfig, ScenarioConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, stream_workflows
from dagsched.sim.snapshot import cluster_view, task_view
from tests.policy.residual_models import random_model

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"
TOL = 1e-5
# torch's Beta log-density is float32 sums of lgammas of the concentrations: lgamma(400) is
# ~2,000, whose float32 ulp is 1.2e-4, and which rounding each of its nine terms takes depends
# on the CPU's vector unit (seen: 1.1e-4 off on an AVX-512 machine, <1e-5 on another). 1e-3
# moves a PPO ratio by 0.1%, 200 times inside its clip.
LOGP_TOL = 1e-3


def recorded_batch(
    nodes: int, seed: int, warmup: int, size: int = 48, faults: bool = False, dead: int = 0
) -> tuple[ClusterView, list[TaskView]]:
    """Ready tasks of the default scenario scaled to `nodes`, gathered over a few steps after
    `warmup` least-loaded batches (several workflows and instants), with their histories."""
    base = ScenarioConfig()
    sc = replace(base, cluster=base.cluster.scaled(nodes))
    if faults:  # node crashes and task failures: retries with a previous node
        sc = replace(
            sc,
            faults=FaultConfig(
                node_failure_per_hour=2.0, repair_mean_s=300, transient_task_failure=0.2
            ),
        )
    sim = Simulator(sc, stream_workflows(sc, seed, 10_000), seed=seed)
    policy = make_policy("least_loaded", seed)
    tasks: list[TaskView] = []
    step = 0
    while (batch := sim.advance()) is not None:
        step += 1
        if step > warmup:
            tasks += [task_view(t, sim) for t in batch]
            if len(tasks) >= size:
                break
        sim.apply(policy.decide(sim, batch), batch)
    view = cluster_view(sim)
    for node in range(dead):
        view.alive[node * 3 % nodes] = False
    return view, tasks[:size]


SCENARIOS = {
    "8 nodes, busy": (8, 0, 150, False, 0),
    "8 nodes, faults": (8, 1, 100, True, 2),
    "32 nodes, busy": (32, 2, 200, False, 0),
    "32 nodes, faults, dead nodes": (32, 3, 150, True, 3),
    "256 nodes": (256, 4, 300, False, 5),
    # idle nodes of a kind alike: ~1 (task, node) row in 6 distinct, embedded once
    "1,024 nodes, idle alike": (1024, 2, 100, False, 0),
}


@pytest.fixture(scope="module")
def champion() -> GNNScheduler:
    return load_bundle(CHAMPION, "v1", smoke=False)


@pytest.fixture(scope="module")
def batches() -> dict[str, tuple[ClusterView, list[TaskView]]]:
    return {
        name: recorded_batch(n, seed, warmup, faults=faults, dead=dead)
        for name, (n, seed, warmup, faults, dead) in SCENARIOS.items()
    }


def _same(a: Observation, b: Observation) -> None:
    assert a.task_idx == b.task_idx
    for f in ("nodes", "mask", "cluster", "dag", "edges", "base", "base_logits"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype and np.array_equal(x, y), f


def assert_fast_equals_plain(sched: GNNScheduler, view: ClusterView, tasks: list[TaskView]) -> None:
    assert sched.numpy_net() is not None  # the fast path serves this model
    free = view.free_cores.copy()
    fast = sched.place(view, tasks)
    assert np.array_equal(view.free_cores, free)  # the caller's view is not written
    seen, units, values = sched.last_observations, sched.last_units, sched.last_values
    assert len({p.node for p in fast}) > 1
    plain = GNNScheduler(sched.model, sched.normalizer, "plain")
    ref_view = view.batch_copy()
    for i in heft_order(tasks):  # the order the batch is placed in: heft_history's
        t = tasks[i]
        o = observe(ref_view, t)
        _same(seen[i], o)
        (p,) = plain.place_observations([o])
        f = fast[i]
        assert f.node == p.node, i
        assert f.max_retries == p.max_retries, i
        assert abs(f.cpu - p.cpu) < TOL and abs(f.mem - p.mem) < TOL, i
        assert np.allclose(units[i], plain.last_units[0], atol=TOL, rtol=0), i
        assert abs(f.log_prob - p.log_prob) < LOGP_TOL, (i, f.log_prob, p.log_prob)
        assert abs(values[i] - plain.last_values[0]) < 1e-4, i
        ref_view.take(t, f.node, f.cpu, f.mem)
    # the whole batch through the plain path takes the same nodes
    assert [p.node for p in sched.place_reference(view, tasks)] == [p.node for p in fast]


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_champion_fast_path_decides_as_the_plain_forward_pass(
    name: str, champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    view, tasks = batches[name]
    assert_fast_equals_plain(champion, view, tasks)


@pytest.mark.parametrize("residual", [0.0, 1.0], ids=["untrained", "random residual"])
@pytest.mark.parametrize("name", ["8 nodes, faults", "32 nodes, busy", "256 nodes"])
def test_random_model_fast_path_decides_as_the_plain_forward_pass(
    name: str,
    residual: float,
    champion: GNNScheduler,
    batches: dict[str, tuple[ClusterView, list[TaskView]]],
) -> None:
    model = random_model(7, residual)
    view, tasks = batches[name]
    assert_fast_equals_plain(GNNScheduler(model, champion.normalizer, "random"), view, tasks)


def test_sampled_actions_carry_the_models_log_probability(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    view, tasks = batches["32 nodes, faults, dead nodes"]
    sched = GNNScheduler(champion.model, champion.normalizer, "t", deterministic=False)
    torch.manual_seed(0)
    placements = sched.place(view, tasks)
    norm: FeatureNormalizer = champion.normalizer
    batch = collate([norm.transform(o) for o in sched.last_observations])
    with torch.no_grad():
        out = champion.model(*batch.args())
        logp, _ = evaluate(
            out,
            torch.tensor([p.node for p in placements]),
            torch.tensor(sched.last_units, dtype=torch.float32),
        )
    got = np.array([p.log_prob for p in placements])
    assert np.allclose(got, logp.numpy(), atol=LOGP_TOL, rtol=0)
    assert all(view.alive[p.node] for p in placements)
    torch.manual_seed(0)
    again = sched.place(view, tasks)  # torch's seed makes the draw repeatable
    assert again == placements
    torch.manual_seed(1)
    assert sched.place(view, tasks) != placements


def test_the_numpy_mirror_follows_weights_changed_in_place(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    model = random_model(3)
    sched = GNNScheduler(model, champion.normalizer, "t")
    view, tasks = batches["32 nodes, busy"]
    sched.place(view, tasks)
    first = sched.numpy_net()
    with torch.no_grad():  # as an optimiser step or load_state_dict does
        model.load_state_dict(champion.model.state_dict())
    assert sched.numpy_net() is not first
    assert_fast_equals_plain(sched, view, tasks)


def test_a_model_the_mirror_does_not_know_is_served_by_the_plain_path(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    class Wider(ActorCritic):  # another architecture: the numpy mirror must not guess
        pass

    model = random_model(5, cls=Wider)
    sched = GNNScheduler(model, champion.normalizer, "t")
    assert sched.numpy_net() is None
    view, tasks = batches["8 nodes, busy"]
    plain = GNNScheduler(model, champion.normalizer, "t")
    assert sched.place(view, tasks) == plain.place_reference(view, tasks)


def test_the_dag_cache_is_bounded_by_task_rows(
    batches: dict[str, tuple[ClusterView, list[TaskView]]],
) -> None:
    _, tasks = batches["32 nodes, busy"]
    by_wf = {id(t.workflow): t for t in tasks}
    assert len(by_wf) >= 3
    first, *rest = by_wf.values()
    cache = DagCache(max_rows=first.workflow.size + 1)
    x = cache.get(first)[0]
    assert cache.get(first)[0] is x  # kept
    for t in rest:
        cache.get(t)
        assert cache.rows <= max(cache.max_rows, t.workflow.size)
    assert cache.get(first)[0] is not x  # evicted, built again
    assert np.array_equal(cache.get(first)[0], x)


def test_bound_caches_bounds_what_a_scheduler_keeps_across_batches(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    view, tasks = batches["32 nodes, busy"]
    sizes = sorted({id(t.workflow): t.workflow.size for t in tasks}.values())
    assert len(sizes) >= 3
    rows = sizes[-1] + 1  # room for the largest workflow, not for all of them
    sched = GNNScheduler(champion.model, champion.normalizer, "bounded").bound_caches(rows, rows)
    unbounded = GNNScheduler(champion.model, champion.normalizer, "unbounded")
    for t in tasks:  # one batch each: every workflow passes through the caches
        assert sched.place(view, [t]) == unbounded.place(view, [t])
    net, free = sched.numpy_net(), unbounded.numpy_net()
    assert net is not None and free is not None
    assert sched._dags.rows <= rows < unbounded._dags.rows
    assert net.encodings.rows <= rows < free.encodings.rows


def test_a_map_stages_siblings_share_one_encoding_and_decide_as_their_own_passes(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    view, recorded = batches["32 nodes, busy"]
    width = 40  # a root, 40 map tasks, a reduce; the map tasks ready at once
    ready = map_stage(recorded[0].workflow.tasks[recorded[0].idx], width, view.now)
    wf = ready[0].workflow
    # with tasks of other workflows around them, in the same batch
    batch = recorded[:4] + ready + recorded[4:8]
    net = champion.numpy_net()
    assert net is not None
    net.encodings = Encodings()
    assert_fast_equals_plain(champion, view, batch)  # encodes the stage's DAG
    kept = net.encodings.rows
    assert kept >= wf.size
    # the next batches of the stage find its encoding kept, and decide the same
    first = champion.place(view, batch)
    assert len({id(o.dag) for o in champion.last_observations[4 : 4 + width]}) == 1
    assert champion.place(view, batch) == first
    assert net.encodings.rows == kept
    assert [p.node for p in first] == [p.node for p in champion.place_reference(view, batch)]


def test_tasks_only_small_nodes_cannot_hold_take_big_ones_on_both_paths(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    """Per-task candidate masks (`observation.candidates`): half the batch gets a family
    history whose memory only the larger nodes can hold; both paths keep those tasks there."""
    view, tasks = batches["32 nodes, busy"]
    cap = view.mem_gb * MEM_BOUNDS[1]
    heavy = []
    for i, t in enumerate(tasks):
        if i % 2:
            spec = t.workflow.tasks[t.idx]
            ratio = float(np.median(cap)) / spec.mem_gb / 1.15 * 1.01
            h = FamilySummary(40, 1.0, 1.0, ratio, ratio, 1.0, 1.0, 0, 0.0)
            t = replace(t, history=h)
        heavy.append(t)
    assert_fast_equals_plain(champion, view, heavy)
    masks = [o.mask for o in champion.last_observations]
    assert sum(not m.all() for m in masks) >= len(tasks) // 2 - 1
    assert all(m[p.node] for m, p in zip(masks, champion.place(view, heavy), strict=True))


def test_exploration_strays_a_few_percent_from_the_served_reservation(
    champion: GNNScheduler, batches: dict[str, tuple[ClusterView, list[TaskView]]]
) -> None:
    """The learner's exploration samples the Betas (`CONC_SCALE`): a sampled CPU or memory
    reservation stays within a few percent of the served one, where an OOM kill can cost an
    hour (docs/concepts/learning.md, "The split")."""
    view, tasks = batches["32 nodes, busy"]
    served = champion.place(view, tasks)
    first = heft_order(tasks)[0]  # the task placed first sees the same cluster in every draw
    sampler = GNNScheduler(champion.model, champion.normalizer, "t", deterministic=False)
    ratios: dict[str, list[float]] = {"cpu": [], "mem": []}
    for seed in range(20):
        torch.manual_seed(seed)
        (p,) = sampler.place(view, [tasks[first]])
        (s,) = champion.place(view, [tasks[first]])
        if p.node == s.node:
            ratios["cpu"].append(p.cpu / s.cpu)
            ratios["mem"].append(p.mem / s.mem)
    assert (served[first].node, served[first].mem) == (s.node, s.mem)
    assert len(ratios["mem"]) >= 5
    for name, r in ratios.items():
        lo, hi = np.percentile(r, [10, 90])
        assert 0.85 <= lo <= 1.0 <= hi <= 1.15, (name, lo, hi)
        assert float(np.std(r)) > 0.002, name  # it does explore
