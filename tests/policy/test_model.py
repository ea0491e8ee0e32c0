"""The actor-critic: any cluster size, masking, bounds, log-probabilities."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from dagsched.core.bounds import ACTION_HIGH, ACTION_LOW, ACTION_NAMES
from dagsched.core.heft import heft_order
from dagsched.core.observation import NODE_FEATURES, observe
from dagsched.policy.collate import collate
from dagsched.policy.model import ActorCritic, ModelConfig, act, evaluate
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import generate_workflows, make_policy, simulate
from dagsched.sim.snapshot import SchedulerPolicy, cluster_view, task_view
from tests.policy.residual_models import random_model
from tests.sim.conftest import small_scenario


def _first_batch(nodes: int):
    sc = small_scenario(nodes=nodes, workflows=3)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    batch = sim.advance()
    assert batch is not None
    return sim, batch


def test_one_model_serves_any_cluster_size(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    for n in (8, 32, 256):
        sim, batch = _first_batch(n)
        sched = GNNScheduler(model, normalizer, "t")
        placements = sched.place(cluster_view(sim), [task_view(t) for t in batch])
        assert len(placements) == len(batch)
        assert all(0 <= p.node < sim.cluster.n for p in placements)


def test_dead_nodes_are_never_chosen(model: ActorCritic, normalizer: FeatureNormalizer) -> None:
    sim, batch = _first_batch(16)
    for node in range(15):
        sim.cluster.set_alive(node, False)
    cv = cluster_view(sim)
    sched = GNNScheduler(model, normalizer, "t", deterministic=False)
    for _ in range(20):
        assert {p.node for p in sched.place(cv, [task_view(t) for t in batch])} == {15}


def test_actions_in_bounds_and_logprob_consistent(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    sim, batch = _first_batch(16)
    cv = cluster_view(sim)
    obs = [normalizer.transform(observe(cv, task_view(t))) for t in batch]
    b = collate(obs)
    out = model(*b.args())
    torch.manual_seed(1)
    node, unit, logp = act(out, deterministic=False)
    again, _ = evaluate(out, node, unit)
    assert torch.allclose(logp, again)
    assert torch.all((unit > 0) & (unit < 1))
    sched = GNNScheduler(model, normalizer, "t", deterministic=False)
    for p in sched.place(cv, [task_view(t) for t in batch]):
        assert 0.1 <= p.cpu <= 0.9 and 0.2 <= p.mem <= 0.8 and 1 <= p.max_retries <= 5
        assert np.isfinite(p.log_prob)


def test_deterministic_mode_is_repeatable(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    sc = small_scenario(workflows=4)
    sched = GNNScheduler(model, normalizer, "t", deterministic=True)
    a = simulate(sc, SchedulerPolicy(sched), seed=1)
    b = simulate(sc, SchedulerPolicy(sched), seed=1)
    assert {k: v for k, v in a.items() if k != "wall_s"} == {
        k: v for k, v in b.items() if k != "wall_s"
    }


def test_observation_shapes() -> None:
    sim, batch = _first_batch(8)
    o = observe(cluster_view(sim), task_view(batch[0]))
    assert o.nodes.shape == (8, len(NODE_FEATURES))
    assert o.dag.shape[0] == batch[0].run.wf.size
    assert o.base.shape == (8, len(ACTION_NAMES)) and o.base_logits.shape == (8,)
    assert np.all((o.base >= ACTION_LOW) & (o.base <= ACTION_HIGH))


def test_siblings_share_their_dag_and_differ_by_their_row(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    """The DAG features do not say which task is placed (so a batch encodes a workflow once
    for all its ready tasks); the model tells siblings apart by the placed task's row."""
    sc = small_scenario(nodes=8, workflows=6)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    policy = make_policy("least_loaded", 0)
    siblings: list = []
    while not siblings and (batch := sim.advance()) is not None:
        by_run: dict[int, list] = {}
        for t in batch:
            by_run.setdefault(id(t.run), []).append(t)
        siblings = next((ts for ts in by_run.values() if len(ts) >= 2), [])
        if not siblings:
            sim.apply(policy.decide(sim, batch), batch)
    a, b = siblings[:2]
    cv = cluster_view(sim)
    oa, ob = observe(cv, task_view(a)), observe(cv, task_view(b))
    assert np.array_equal(oa.dag, ob.dag) and oa.task_idx != ob.task_idx
    x = collate([normalizer.transform(oa), normalizer.transform(ob)])
    with torch.no_grad():
        dag = model.encode_dag(x.dag_x, x.dag_edges, x.dag_batch, x.this_task, 2)
    h = model.cfg.hidden
    assert torch.allclose(dag[0, :h], dag[1, :h])  # the pooled workflow: one encoding
    assert not torch.allclose(dag[0, h:], dag[1, h:])  # the placed task: its own row


def test_actor_parameters_are_only_the_heads() -> None:
    model = ActorCritic(ModelConfig())
    heads = {id(p) for p in model.actor_parameters()}
    named = dict(model.named_parameters())
    assert heads == {id(p) for n, p in named.items() if n.startswith(("scorer.", "cont_head."))}
    assert 0 < len(heads) < len(named)


def test_a_batch_is_placed_in_order_each_task_seeing_the_earlier_ones(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    sim, batch = _first_batch(8)
    tasks = [task_view(batch[0])] * 3  # three identical siblings: the scatter case
    cv = cluster_view(sim)
    sched = GNNScheduler(model, normalizer, "t")
    placements = sched.place(cv, tasks)
    used = NODE_FEATURES.index("cpu_used")
    first, second = sched.last_observations[:2]
    node = placements[0].node
    assert second.nodes[node, used] > first.nodes[node, used]  # the first one is taken
    assert (cv.free_cores == sim.cluster.cores).all()  # the caller's view is not written
    stale = GNNScheduler(model, normalizer, "t")
    stale.place_observations([observe(cv, t) for t in tasks])  # one snapshot for all
    assert np.array_equal(stale.last_observations[0].nodes, stale.last_observations[1].nodes)


def test_a_batch_placed_in_order_decides_as_one_forward_pass_per_task(
    normalizer: FeatureNormalizer,
) -> None:
    """`place` encodes the batch's DAGs once; each decision equals a full forward pass on
    that task's own observation (the cluster with the earlier placements taken)."""
    model = random_model(3)
    sc = small_scenario(nodes=16, workflows=6)
    sim = Simulator(sc, generate_workflows(sc, 0), seed=0)
    policy = make_policy("least_loaded", 0)
    tasks: list = []  # ready tasks of several workflows and instants, as one batch
    while len(tasks) < 12 and (batch := sim.advance()) is not None:
        tasks += [task_view(t) for t in batch]
        sim.apply(policy.decide(sim, batch), batch)
    assert len({t.workflow.id for t in tasks}) > 1
    cv = cluster_view(sim)
    sched = GNNScheduler(model, normalizer, "t")
    placements = sched.place(cv, tasks)
    assert len({p.node for p in placements}) > 1
    one = GNNScheduler(model, normalizer, "t")
    view = cv.batch_copy()
    for i in heft_order(tasks):  # the order the batch is placed in: heft_history's
        t = tasks[i]
        o = observe(view, t)
        assert np.array_equal(o.nodes, sched.last_observations[i].nodes)
        assert np.array_equal(o.dag, sched.last_observations[i].dag)
        (p,) = one.place_observations([o])
        got = placements[i]
        assert p.node == got.node
        assert abs(p.cpu - got.cpu) < 1e-5 and abs(p.mem - got.mem) < 1e-5
        assert p.max_retries == got.max_retries and abs(p.log_prob - got.log_prob) < 1e-4
        assert abs(one.last_values[0] - sched.last_values[i]) < 1e-5
        view.take(t, got.node, got.cpu, got.mem)  # as the batch did (equal to float rounding)


def test_permuting_the_nodes_permutes_the_logits(normalizer: FeatureNormalizer) -> None:
    sim, batch = _first_batch(16)
    model = random_model(0)
    o = normalizer.transform(observe(cluster_view(sim), task_view(batch[0])))
    perm = np.random.default_rng(0).permutation(16)
    shuffled = replace(
        o,
        nodes=o.nodes[perm],
        mask=o.mask[perm],
        base=o.base[perm],
        base_logits=o.base_logits[perm],
    )
    with torch.no_grad():
        a = model(*collate([o]).args())
        b = model(*collate([shuffled]).args())
    assert torch.allclose(a.logits[0, perm], b.logits[0], atol=1e-5)
    assert torch.allclose(a.conc[0, perm], b.conc[0], atol=1e-5)
    assert torch.allclose(a.value, b.value, atol=1e-5)


def _mixed_cluster_sizes(normalizer: FeatureNormalizer):
    """Raw observations from an 8- and a 16-node cluster: the batch pads the smaller one."""
    raw = []
    for n in (8, 16):
        sim, batch = _first_batch(n)
        cv = cluster_view(sim)
        raw += [observe(cv, task_view(t)) for t in batch]
    return raw


def test_batch_normalisation_matches_normalising_each_observation(
    normalizer: FeatureNormalizer,
) -> None:
    raw = _mixed_cluster_sizes(normalizer)
    each = collate([normalizer.transform(o) for o in raw])
    batch = normalizer.transform_batch(collate(raw))
    assert torch.allclose(batch.cluster, each.cluster, atol=1e-5)
    assert torch.allclose(batch.dag_x, each.dag_x, atol=1e-5)
    for i, o in enumerate(raw):  # rows past a cluster's own nodes are padding, masked
        k = o.nodes.shape[0]
        assert torch.allclose(batch.nodes[i, :k], each.nodes[i, :k], atol=1e-5)
        assert not batch.mask[i, k:].any()
    assert not torch.equal(batch.nodes, collate(raw).nodes)


def test_compiled_forward_places_like_the_eager_model(
    model: ActorCritic, normalizer: FeatureNormalizer
) -> None:
    raw = _mixed_cluster_sizes(normalizer)
    eager = GNNScheduler(model, normalizer, "t").place_observations(raw)
    compiled = GNNScheduler(model, normalizer, "t").compile().place_observations(raw)
    assert [p.node for p in compiled] == [p.node for p in eager]
    for c, e in zip(compiled, eager, strict=True):
        assert abs(c.cpu - e.cpu) < 1e-4 and abs(c.mem - e.mem) < 1e-4
