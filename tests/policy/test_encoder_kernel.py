"""The compiled DAG encoder (`encoder_kernel`, through `NumpyNet.encode_graphs`) gives what
the torch model's `encode_dag` gives - PyG's GATv2 layers and attention pooling - on DAGs of
several sizes in one batch, for the shipped champion and a randomly initialised model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from dagsched.core.observation import dag_features
from dagsched.core.view import TaskView
from dagsched.policy.bundle import load_bundle
from dagsched.policy.collate import collate_dags
from dagsched.policy.model import ActorCritic
from dagsched.policy.numpy_net import NumpyNet, batch_graph
from dagsched.policy.vectorised_observation import in_edges
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import stream_workflows

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


def _dags(count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """`dag_features` of `count` workflows of the default scenario, some tasks done or active."""
    rng = np.random.default_rng(0)
    out = []
    for wf in stream_workflows(ScenarioConfig(), 5, count):
        done = rng.random(wf.size) < 0.3
        active = ~done & (rng.random(wf.size) < 0.3)
        out.append(dag_features(TaskView(wf, 0, 0, done, active, [], -1, 100.0)))
    return out


@pytest.mark.parametrize("which", ["champion", "random"])
def test_compiled_encoder_matches_the_torch_encoder(which: str) -> None:
    champion = load_bundle(CHAMPION, "t", smoke=False)
    model = champion.model
    if which == "random":
        torch.manual_seed(3)
        model = ActorCritic(champion.model.cfg)
    net = NumpyNet(model, champion.normalizer)
    dags = _dags(7)
    sizes = [x.shape[0] for x, _ in dags]
    assert len(set(sizes)) > 2  # DAGs of several sizes in one graph
    graph, firsts = batch_graph([(x.shape[0], *in_edges(x.shape[0], e)) for x, e in dags])
    pooled, rows = net.encode_graphs(np.concatenate([x for x, _ in dags]), graph, firsts)

    dag_x, edges, batch, _ = collate_dags(dags, [0] * len(dags))
    with torch.no_grad():
        x = champion.normalizer.normalize("dag", dag_x)
        want = model.encode_dag(x, edges, batch, torch.from_numpy(firsts), len(dags))
    h = model.cfg.hidden
    np.testing.assert_allclose(pooled, want[:, :h].numpy(), atol=2e-5, rtol=0)
    # every task's row: the j-th task of each DAG (its last where it has fewer) per call
    for j in range(max(sizes)):
        idx = firsts + np.minimum(j, np.array(sizes) - 1)
        with torch.no_grad():
            got = model.encode_dag(x, edges, batch, torch.from_numpy(idx), len(dags))
        np.testing.assert_allclose(rows[idx], got[:, h:].numpy(), atol=2e-5, rtol=0)
