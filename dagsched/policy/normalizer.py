"""Feature normalizer: one scikit-learn StandardScaler per feature group, fitted on rollouts.

Saved with joblib next to the model's weights in the same registry version: a model never
runs without the preprocessing it was trained with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import joblib
import numpy as np
import torch
from sklearn.preprocessing import StandardScaler

from dagsched.core.observation import CLUSTER_FEATURES, DAG_FEATURES, NODE_FEATURES, Observation
from dagsched.policy.collate import ObsBatch

GROUPS = {"nodes": NODE_FEATURES, "cluster": CLUSTER_FEATURES, "dag": DAG_FEATURES}


class FeatureNormalizer:
    """Standardises node, cluster and DAG features; clips to +-10 sigma."""

    def __init__(self) -> None:
        self.scalers: dict[str, StandardScaler] = {g: StandardScaler() for g in GROUPS}
        self.fitted = False
        self._stats: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def fit(self, observations: Sequence[Observation]) -> FeatureNormalizer:
        """Fit every group on the rows of `observations` (alive nodes only for nodes)."""
        if not observations:
            raise ValueError("cannot fit a normalizer on no observations")
        self.scalers["nodes"].fit(np.concatenate([o.nodes for o in observations]))
        self.scalers["cluster"].fit(np.stack([o.cluster for o in observations]))
        self.scalers["dag"].fit(np.concatenate([o.dag for o in observations]))
        self.fitted = True
        self._stats, self._tensors = {}, {}
        return self

    def transform(self, o: Observation) -> Observation:
        """A normalised copy of `o`."""
        if not self.fitted:
            raise RuntimeError("normalizer used before it was fitted")
        return Observation(
            nodes=self._apply("nodes", o.nodes),
            mask=o.mask,
            cluster=self._apply("cluster", o.cluster[None, :])[0],
            dag=self._apply("dag", o.dag),
            edges=o.edges,
            task_idx=o.task_idx,
            base=o.base,
            base_logits=o.base_logits,
        )

    def transform_batch(self, batch: ObsBatch) -> ObsBatch:
        """`batch` (collated raw observations) normalised in three tensor operations: the
        same numbers as collating `transform`ed observations, except in padded node rows,
        which the model masks. The fast path for serving large batches."""
        return replace(
            batch,
            nodes=self.normalize("nodes", batch.nodes),
            cluster=self.normalize("cluster", batch.cluster),
            dag_x=self.normalize("dag", batch.dag_x),
        )

    def normalize(self, group: str, x: torch.Tensor) -> torch.Tensor:
        """Raw features of one group (nodes, cluster or dag), as a tensor, normalised."""
        if not self.fitted:
            raise RuntimeError("normalizer used before it was fitted")
        if group not in self._tensors:
            m, i = self.stats(group)
            self._tensors[group] = (
                torch.from_numpy(m.astype(np.float32)),
                torch.from_numpy(i.astype(np.float32)),
            )
        mean, inv = self._tensors[group]
        return ((x - mean) * inv).clamp(-10.0, 10.0)

    def stats(self, group: str) -> tuple[np.ndarray, np.ndarray]:
        """(mean, 1 / scale) of a group; a constant feature is scaled by 1."""
        if group not in self._stats:
            s = self.scalers[group]
            self._stats[group] = (s.mean_, 1.0 / np.where(s.scale_ > 0, s.scale_, 1.0))
        return self._stats[group]

    def _apply(self, group: str, x: np.ndarray) -> np.ndarray:
        mean, inv = self.stats(group)
        return np.clip((x - mean) * inv, -10.0, 10.0).astype(np.float32, copy=False)

    def save(self, path: Path) -> None:
        """Write with joblib."""
        joblib.dump({"version": 1, "scalers": self.scalers, "groups": GROUPS}, path)

    @classmethod
    def load(cls, path: Path) -> FeatureNormalizer:
        """Read a normalizer written by `save`; refuses one with other feature names."""
        data = joblib.load(path)
        if data.get("groups") != GROUPS:
            raise ValueError(f"{path}: normalizer was fitted on other features")
        out = cls()
        out.scalers = data["scalers"]
        out.fitted = True
        return out
