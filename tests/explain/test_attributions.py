"""Integrated-gradients attributions of the shipped champion on a real simulator observation:
completeness within the stated tolerance, and the pieces the CLI shows."""

from __future__ import annotations

import numpy as np
import pytest

from dagsched.core.observation import CLUSTER_FEATURES, DAG_FEATURES, NODE_FEATURES
from dagsched.policy.attribution import explain_observation
from dagsched.policy.explanation import (
    CORE_TARGETS,
    DEFAULT_STEPS,
    TOLERANCE_ABS,
    TOLERANCE_REL,
    ExplainError,
)


@pytest.fixture(scope="module")
def explained(champion, sim_obs):
    obs, ids = sim_obs
    return explain_observation(
        champion.model,
        champion.normalizer,
        obs,
        targets=(*CORE_TARGETS, "node_scores"),
        node_ids=ids,
    )


def test_contributions_sum_to_the_output_change_within_tolerance(explained):
    assert explained.n_steps == DEFAULT_STEPS
    assert set(explained.targets) == {*CORE_TARGETS, "node_scores"}
    for name, t in explained.targets.items():
        total = t.nodes.sum() + t.cluster.sum() + t.dag.sum()
        change = t.output - t.baseline_output
        tol = max(TOLERANCE_ABS, TOLERANCE_REL * abs(change))
        assert abs(total - change) <= tol, (name, total, change)
        assert t.complete
        assert abs(t.captum_delta) <= tol  # Captum's own convergence delta agrees
    # the decision is not trivially at the baseline: something was attributed
    assert abs(explained.targets["logit_chosen"].total) > 1e-3


def test_targets_match_the_model_and_each_other(champion, sim_obs, explained):
    obs, _ = sim_obs
    p = champion.place_observations([obs])[0]
    ex = explained
    assert ex.chosen == p.node == ex.recomputed_choice
    assert ex.runner_up is not None and ex.runner_up != ex.chosen and obs.mask[ex.runner_up]
    assert ex.targets["cpu"].output == pytest.approx(p.cpu, abs=1e-4)
    assert ex.targets["mem"].output == pytest.approx(p.mem, abs=1e-4)
    assert ex.targets["logit_chosen"].output == pytest.approx(ex.logits[ex.chosen], abs=1e-4)
    gap = ex.targets["logit_gap"]
    assert gap.output == pytest.approx(ex.logits[ex.chosen] - ex.logits[ex.runner_up], abs=1e-4)
    c, r = ex.targets["logit_chosen"], ex.targets["logit_runner_up"]
    np.testing.assert_allclose(gap.nodes, c.nodes - r.nodes)
    # one shared per-node scorer: a node's logit depends only on its own node features
    others = np.delete(c.nodes, ex.chosen, axis=0)
    assert np.abs(others).max() < 1e-6
    # the heatmap rows are each node's attribution of its own logit
    np.testing.assert_allclose(
        ex.targets["node_scores"].nodes[ex.chosen], c.nodes[ex.chosen], atol=1e-4
    )


def test_contributions_are_named_with_raw_values(sim_obs, explained):
    obs, ids = sim_obs
    rows = explained.contributions("logit_chosen")
    n, t = obs.nodes.shape[0], obs.dag.shape[0]
    assert len(rows) == n * len(NODE_FEATURES) + len(CLUSTER_FEATURES) + t * len(DAG_FEATURES)
    assert abs(rows[0].contribution) >= abs(rows[-1].contribution)
    for row in rows[:30]:
        if row.group == "node":
            i = ids.index(row.entity)
            assert row.value == pytest.approx(obs.nodes[i, NODE_FEATURES.index(row.feature)])
        elif row.group == "cluster":
            assert row.value == pytest.approx(obs.cluster[CLUSTER_FEATURES.index(row.feature)])
        else:
            j = int(row.entity.split()[1])
            assert row.value == pytest.approx(obs.dag[j, DAG_FEATURES.index(row.feature)])
    d = explained.to_dict(top=5)
    assert d["completeness"]["ok"] is True
    top = d["targets"]["logit_chosen"]["top"]
    # the champion decides as heft_history (its residual is zero): a node's score is its
    # estimated finish time, and that feature of the chosen node carries the choice
    assert 1 <= len(top) <= 5
    assert (top[0]["feature"], top[0]["entity"]) == ("log_pred_finish_s", ids[explained.chosen])
    assert d["separation"]["node_features"]


def test_a_chosen_index_outside_the_cluster_is_refused(champion, sim_obs):
    obs, _ = sim_obs
    with pytest.raises(ExplainError, match="outside"):
        explain_observation(champion.model, champion.normalizer, obs, chosen=99)
