"""Collate observations into the tensors `ActorCritic.forward` takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dagsched.core.bounds import ACTION_NAMES, to_unit
from dagsched.core.observation import Observation

N_CONT = len(ACTION_NAMES)


@dataclass
class ObsBatch:
    """A batch of decisions. Clusters of different sizes are padded and masked."""

    nodes: Tensor
    mask: Tensor
    cluster: Tensor
    dag_x: Tensor
    dag_edges: Tensor
    dag_batch: Tensor
    this_task: Tensor
    anchor: Tensor  # heft_history's action per node, in the head's unit space
    base_logits: Tensor  # heft_history's node scores

    def to(self, device: torch.device) -> ObsBatch:
        return ObsBatch(*(getattr(self, f).to(device) for f in self.__dataclass_fields__))

    def args(self) -> tuple[Tensor, ...]:
        return (
            self.nodes,
            self.mask,
            self.cluster,
            self.dag_x,
            self.dag_edges,
            self.dag_batch,
            self.this_task,
            self.anchor,
            self.base_logits,
        )


def collate_dags(
    dags: Sequence[tuple[np.ndarray, np.ndarray]], task_idx: Sequence[int]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The DAG part of a batch from (features, edges) per decision: `dag_x`, `dag_edges`
    (both directions), `dag_batch` and `this_task`, as `ActorCritic.encode_dag` takes them."""
    sizes = [d.shape[0] for d, _ in dags]
    offsets = np.cumsum([0, *sizes[:-1]])
    dag_x = np.concatenate([d for d, _ in dags])
    edges = np.concatenate([e + off for (_, e), off in zip(dags, offsets, strict=True)], axis=1)
    edges = np.concatenate([edges, edges[::-1]], axis=1)
    return (
        torch.from_numpy(dag_x.astype(np.float32)),
        torch.from_numpy(edges.astype(np.int64)),
        torch.from_numpy(np.repeat(np.arange(len(dags)), sizes).astype(np.int64)),
        torch.from_numpy((offsets + np.asarray(task_idx)).astype(np.int64)),
    )


def collate(obs: Sequence[Observation]) -> ObsBatch:
    """Stack normalised observations; DAG edges are added in both directions."""
    b = len(obs)
    n = max(o.nodes.shape[0] for o in obs)
    f = obs[0].nodes.shape[1]
    nodes = np.zeros((b, n, f), dtype=np.float32)
    mask = np.zeros((b, n), dtype=bool)
    anchor = np.full((b, n, N_CONT), 0.5, dtype=np.float32)
    base_logits = np.zeros((b, n), dtype=np.float32)
    for i, o in enumerate(obs):
        k = o.nodes.shape[0]
        nodes[i, :k] = o.nodes
        mask[i, :k] = o.mask
        anchor[i, :k] = to_unit(o.base)
        base_logits[i, :k] = o.base_logits
    dag_x, dag_edges, dag_batch, this_task = collate_dags(
        [(o.dag, o.edges) for o in obs], [o.task_idx for o in obs]
    )
    return ObsBatch(
        nodes=torch.from_numpy(nodes),
        mask=torch.from_numpy(mask),
        cluster=torch.from_numpy(np.stack([o.cluster for o in obs]).astype(np.float32)),
        dag_x=dag_x,
        dag_edges=dag_edges,
        dag_batch=dag_batch,
        this_task=this_task,
        anchor=torch.from_numpy(anchor),
        base_logits=torch.from_numpy(base_logits),
    )
