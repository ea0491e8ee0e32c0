"""An untrained model is heft_history: the residual policy starts exactly at its base.

The actor's node logits are heft_history's own scores plus a learned residual, and its
reservations, retries and priority are heft_history's values at the chosen node moved by a
learned shift; both residuals' last layers start at zero. So the initial model decides as
`heft_history_srpt` does, task by task (node, retries and priority exactly, reservations to
1e-6), on the served path and on the plain forward pass, and a whole simulated run of it
reproduces heft_history's metrics exactly.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from dagsched.core.heft import HeftHistory, heft_order
from dagsched.core.scheduler import Placement
from dagsched.core.view import TaskView
from dagsched.policy.collate import collate
from dagsched.policy.model import ActorCritic, ModelConfig, kl_to_base, residual
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import make_policy, simulate
from dagsched.sim.snapshot import SchedulerPolicy
from tests.policy.residual_models import with_random_residual
from tests.policy.test_fast_exact import recorded_batch

RES_TOL = 1e-6


@pytest.fixture(scope="module")
def initial(normalizer: FeatureNormalizer) -> GNNScheduler:
    torch.manual_seed(0)
    return GNNScheduler(ActorCritic(ModelConfig()), normalizer, "initial")


def _assert_same(got: list[Placement], want: list[Placement]) -> None:
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.node, g.max_retries, g.priority) == (w.node, w.max_retries, w.priority), i
        assert abs(g.cpu - w.cpu) <= RES_TOL and abs(g.mem - w.mem) <= RES_TOL, i


@pytest.mark.parametrize(
    ("nodes", "seed", "warmup", "faults", "dead"),
    [(8, 1, 100, True, 2), (32, 2, 200, False, 0), (256, 4, 300, False, 5)],
    ids=["8 nodes, faults", "32 nodes, busy", "256 nodes"],
)
def test_the_initial_model_decides_as_heft_history_on_both_paths(
    initial: GNNScheduler, nodes: int, seed: int, warmup: int, faults: bool, dead: int
) -> None:
    view, tasks = recorded_batch(nodes, seed, warmup, faults=faults, dead=dead)
    base: list[TaskView] = list(tasks)
    want = HeftHistory("srpt").place(view.batch_copy(), base)
    assert len({p.node for p in want}) > 1 and len({p.priority for p in want}) > 1
    fast = initial.place(view, base)
    assert initial.numpy_net() is not None  # the served path placed it
    _assert_same(fast, want)
    _assert_same(initial.place_reference(view, base), want)


def test_a_trained_residual_moves_away_from_heft_history(initial: GNNScheduler) -> None:
    """The test above is not vacuous: a residual that is not zero decides differently."""
    view, tasks = recorded_batch(32, 2, 200)
    moved = ActorCritic(ModelConfig())
    moved.load_state_dict(initial.model.state_dict())
    with torch.no_grad():
        moved.cont_head[-1].bias[0::2] += 0.5  # every value's shift: more of each
    sched = GNNScheduler(moved, initial.normalizer, "moved")
    want = HeftHistory("srpt").place(view.batch_copy(), tasks)
    got = sched.place(view, tasks)
    first = heft_order(tasks)[0]  # placed on the same cluster by both
    g, w = got[first], want[first]
    assert g.node == w.node
    assert g.cpu > w.cpu + RES_TOL and g.mem > w.mem + RES_TOL and g.priority > w.priority


def test_a_run_of_the_initial_model_is_a_run_of_heft_history(initial: GNNScheduler) -> None:
    base = ScenarioConfig()
    sc = replace(base, workload=replace(base.workload, workflows=40))
    seed = 20_000  # held out: training draws seeds below it
    ours = simulate(sc, SchedulerPolicy(initial), seed=seed)
    theirs = simulate(sc, make_policy("heft_history_srpt", seed), seed=seed)
    for key in ("sla_attainment", "mean_jct_s", "cost_core_s", "oom_kills", "total_reward"):
        assert ours[key] == theirs[key], key
    assert ours["workflows"] == 40 and ours["sla_attainment"] > 0


def test_the_kl_to_the_base_is_zero_at_the_start_and_grows_with_the_residual(
    initial: GNNScheduler,
) -> None:
    view, tasks = recorded_batch(32, 2, 200)
    initial.place(view, tasks)
    batch = initial.normalizer.transform_batch(collate(list(initial.last_observations)))
    nodes = torch.tensor([o.base_logits.argmax() for o in initial.last_observations])
    kls = []
    for scale in (0.0, 0.1, 1.0):
        model = with_random_residual(ActorCritic(ModelConfig()), 3, scale)
        model.load_state_dict(
            {**model.state_dict(), **{k: v for k, v in initial.model.state_dict().items()
                                      if not k.startswith(("scorer.", "cont_head."))}}
        )  # fmt: skip
        with torch.no_grad():
            out = model(*batch.args())
            kls.append(
                float(kl_to_base(out, batch.base_logits, batch.mask, batch.anchor, nodes).mean())
            )
    assert kls[0] == pytest.approx(0.0, abs=1e-6)
    assert 0 < kls[1] < kls[2]


def test_a_zero_shift_has_the_true_slope_so_training_can_leave_the_base() -> None:
    """At the zero every head starts from, d residual / d shift is a(1-a) - the derivative of
    sigmoid(logit(a) + shift) - and the value is exactly 0. A slope of 0 there (autograd's
    choice for |x| at 0) would hold the shifts at the base forever."""
    a = torch.tensor([0.02, 0.3, 0.5, 0.9], dtype=torch.float64)
    shift = torch.zeros_like(a, requires_grad=True)
    value = residual(a, shift)
    (grad,) = torch.autograd.grad(value.sum(), shift)
    assert (value == 0).all()
    assert torch.allclose(grad, a * (1 - a))
    for s in (-3.0, -1e-4, 1e-4, 3.0):  # and the value is sigmoid's, either side
        moved = residual(a, torch.full_like(a, s))
        assert torch.allclose(moved, torch.sigmoid(torch.logit(a) + s) - a)
