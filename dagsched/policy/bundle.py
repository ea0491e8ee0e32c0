"""A model bundle: the folder of files that is one servable policy version.

    state_dict.pt        weights (loaded with weights_only=True)
    normalizer.joblib    the fitted feature normalizer
    model_config.json    network shapes
    feature_schema.json  feature names per group (must match this code's features)
    checksums.json       SHA-256 of each file above

The registry stores a bundle as a version's artifacts and the repository ships one as the
default champion. Loading verifies every checksum, the schema and a smoke inference (on
synthetic observation types, never the simulator).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dagsched.core.observation import CLUSTER_FEATURES, DAG_FEATURES, NODE_FEATURES, observe
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import TaskSpec, TaskType, Workflow
from dagsched.policy.model import ActorCritic, ModelConfig
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler

FILES = ("state_dict.pt", "normalizer.joblib", "model_config.json", "feature_schema.json")
CHECKSUMS = "checksums.json"


class BundleError(ValueError):
    """A bundle is missing files, tampered with, or incompatible with this code."""


def feature_schema() -> dict[str, list[str]]:
    """Feature names per group, as this code computes them (stored with every bundle)."""
    return {
        "nodes": list(NODE_FEATURES),
        "cluster": list(CLUSTER_FEATURES),
        "dag": list(DAG_FEATURES),
    }


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 1 MiB chunks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_bundle(folder: Path, model: ActorCritic, normalizer: FeatureNormalizer) -> dict[str, str]:
    """Write the bundle files and their checksums; return the checksums."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / "state_dict.pt")
    normalizer.save(folder / "normalizer.joblib")
    (folder / "model_config.json").write_text(json.dumps(model.cfg.to_dict(), indent=2) + "\n")
    (folder / "feature_schema.json").write_text(json.dumps(feature_schema(), indent=2) + "\n")
    sums = {name: sha256(folder / name) for name in FILES}
    (folder / CHECKSUMS).write_text(json.dumps(sums, indent=2, sort_keys=True) + "\n")
    return sums


def verify_checksums(folder: Path, expected: dict[str, str] | None = None) -> dict[str, str]:
    """Check every file against `expected` (default: the bundle's own checksums.json)."""
    if expected is None:
        try:
            expected = json.loads((folder / CHECKSUMS).read_text())
        except (OSError, ValueError) as exc:
            raise BundleError(f"{folder}: cannot read {CHECKSUMS}: {exc}") from None
    assert expected is not None
    for name in FILES:
        path = folder / name
        if not path.is_file():
            raise BundleError(f"{folder}: missing {name}")
        got = sha256(path)
        if expected.get(name) != got:
            raise BundleError(f"{folder}: checksum mismatch for {name} (tampered or corrupt)")
    return expected


def load_bundle(
    folder: Path, version: str, expected: dict[str, str] | None = None, smoke: bool = True
) -> GNNScheduler:
    """Verify and load a bundle as a serving (deterministic) scheduler."""
    verify_checksums(folder, expected)
    schema = json.loads((folder / "feature_schema.json").read_text())
    if schema != feature_schema():
        raise BundleError(f"{folder}: trained on other features than this code computes")
    try:
        cfg = ModelConfig(**json.loads((folder / "model_config.json").read_text()))
        model = ActorCritic(cfg)
        state = torch.load(folder / "state_dict.pt", map_location="cpu", weights_only=True)
        model.load_state_dict(state)
        normalizer = FeatureNormalizer.load(folder / "normalizer.joblib")
    except (OSError, ValueError, RuntimeError, TypeError, KeyError) as exc:
        raise BundleError(f"{folder}: incompatible model: {exc}") from None
    sched = GNNScheduler(model, normalizer, version, deterministic=True)
    if smoke:
        smoke_inference(sched)
    return sched


def smoke_views(n_nodes: int = 8) -> tuple[ClusterView, list[TaskView]]:
    """A small synthetic cluster (all four node kinds, two zones, idle) and two tasks of one
    workflow: its CPU root, and its GPU child whose parent ran on node 0."""
    kind = np.arange(n_nodes) % 4  # cpu, gpu, io, mem: the order of sim.config.NODE_KINDS
    cores = np.where(kind == 0, 32.0, 16.0)
    mem_gb = np.where(kind == 3, 512.0, 128.0)
    cluster = ClusterView(
        now=0.0,
        node_ids=[f"smoke-{i}" for i in range(n_nodes)],
        kind=kind,
        zone=np.arange(n_nodes) % 2,
        cores=cores,
        mem_gb=mem_gb,
        gpu_mem_gb=np.where(kind == 1, 80.0, 0.0),
        net_gbps=np.full(n_nodes, 25.0),
        speed=np.ones((n_nodes, len(TaskType))),
        alive=np.ones(n_nodes, dtype=bool),
        free_cores=cores.copy(),
        free_mem=mem_gb.copy(),
        queue_len=np.zeros(n_nodes),
        queued_core_s=np.zeros(n_nodes),
        net_in_bytes=np.zeros(n_nodes),
        failure_rate=np.zeros(n_nodes),
        slowdown=np.ones(n_nodes),
    )
    specs = [
        TaskSpec("a", TaskType.CPU, 10, 2, 4, output_bytes=1e8),
        TaskSpec("b", TaskType.GPU, 10, 2, 8),
    ]
    wf = Workflow.build("smoke", specs, [(0, 1)], deadline_s=100)

    def task(idx: int, parent_nodes: list[int], sub_deadline_s: float) -> TaskView:
        """Task `idx`, the tasks before it done, itself ready."""
        order = np.arange(wf.size)
        return TaskView(wf, idx, 0, order < idx, order == idx, parent_nodes, -1, sub_deadline_s)

    return cluster, [task(0, [], 50.0), task(1, [0], 100.0)]


def smoke_inference(sched: GNNScheduler) -> None:
    """Place the `smoke_views` tasks in one forward pass, then through the served path
    (`place`: the numpy mirror and its compiled loops, which numba compiles or loads from its
    cache here, so that a daemon's first batch does not wait ~0.2-4 s for it); refuse NaNs or
    out-of-range actions from either. Needs only the observation types: no simulator, no
    scenario."""
    cluster, tasks = smoke_views()
    try:
        placements = sched.place_observations([observe(cluster, t) for t in tasks])
        placements += sched.place(cluster, tasks)
    except (ValueError, RuntimeError) as exc:  # e.g. NaN outputs that cannot be rounded
        raise BundleError(f"smoke inference failed: {exc}") from None
    for p in placements:
        values: list[Any] = [p.cpu, p.mem, p.log_prob]
        if not (0 <= p.node < cluster.n) or not np.all(np.isfinite(values)):
            raise BundleError(f"smoke inference produced an invalid placement: {p}")
