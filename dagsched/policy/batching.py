"""Collate observations into the tensors `ActorCritic.forward` takes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from dagsched.policy.features import Observation


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
    anchor: Tensor

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
        )


def collate(obs: Sequence[Observation]) -> ObsBatch:
    """Stack normalised observations; DAG edges are added in both directions."""
    b = len(obs)
    n = max(o.nodes.shape[0] for o in obs)
    f = obs[0].nodes.shape[1]
    nodes = np.zeros((b, n, f), dtype=np.float32)
    mask = np.zeros((b, n), dtype=bool)
    anchor = np.full((b, n, 3), 0.5, dtype=np.float32)
    for i, o in enumerate(obs):
        k = o.nodes.shape[0]
        nodes[i, :k] = o.nodes
        mask[i, :k] = o.mask
        anchor[i, :k] = o.anchor
    offsets = np.cumsum([0] + [o.dag.shape[0] for o in obs[:-1]])
    dag_x = np.concatenate([o.dag for o in obs])
    edges = np.concatenate([o.edges + off for o, off in zip(obs, offsets, strict=True)], axis=1)
    edges = np.concatenate([edges, edges[::-1]], axis=1)
    dag_batch = np.repeat(np.arange(b), [o.dag.shape[0] for o in obs])
    this = offsets + np.array([o.task_idx for o in obs])
    return ObsBatch(
        nodes=torch.from_numpy(nodes),
        mask=torch.from_numpy(mask),
        cluster=torch.from_numpy(np.stack([o.cluster for o in obs]).astype(np.float32)),
        dag_x=torch.from_numpy(dag_x.astype(np.float32)),
        dag_edges=torch.from_numpy(edges.astype(np.int64)),
        dag_batch=torch.from_numpy(dag_batch.astype(np.int64)),
        this_task=torch.from_numpy(this.astype(np.int64)),
        anchor=torch.from_numpy(anchor),
    )
