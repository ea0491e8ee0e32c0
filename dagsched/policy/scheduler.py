"""`GNNScheduler`: the trained actor-critic behind the `Scheduler` contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import structlog
import torch
from threadpoolctl import ThreadpoolController

from dagsched.core.observation import Observation, dag_features, observe
from dagsched.core.scheduler import Placement
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import upward_rank
from dagsched.policy.collate import collate, collate_dags
from dagsched.policy.fast_place import place_fast
from dagsched.policy.model import ActorCritic, PolicyOutput, act, from_unit
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.numpy_net import NumpyNet, Unsupported
from dagsched.policy.vectorised_observation import DagCache

log = structlog.get_logger(__name__)
_blas: list[ThreadpoolController] = []  # made on first use, not at import


def _one_blas_thread() -> AbstractContextManager[object]:
    """numpy's BLAS on one thread for a fast-path batch (~7 us to set and restore). The fast
    path is a chain of small products; OpenBLAS's default pool (a thread per core) made a
    batch of 16 tasks 13x slower on this 2-core machine while other processes ran, its
    threads waiting for cores."""
    if not _blas:
        _blas.append(ThreadpoolController())
    return _blas[0].limit(limits=1, user_api="blas")


class GNNScheduler:
    """Places a batch of tasks.

    `place` puts them one by one, each observing the cluster with the batch's earlier
    placements taken, as HEFT and the daemon's accounting do: from one snapshot, a scatter of
    20 ready siblings would see 20 identical clusters and pile onto one node. It runs the
    fast path (`fast_place`: the network in numpy, once per batch, and per task only what
    the earlier placements changed); `place_reference` is the plain torch forward pass per
    task, which the fast path equals to float rounding and which serves a model whose
    structure the numpy mirror does not know (`numpy_net.Unsupported`).
    `place_observations` is one batched forward pass over observations already built.
    `deterministic=True` (serving) takes the argmax node and the Beta means; otherwise
    actions are sampled. `compile()` swaps in a torch.compile'd forward pass.
    `last_observations` keeps the raw features of the last batch so a caller (training, the
    decision log) can record what the decision was made from.
    """

    def __init__(
        self,
        model: ActorCritic,
        normalizer: FeatureNormalizer,
        version: str,
        deterministic: bool = True,
    ) -> None:
        self.model = model.eval()
        self.normalizer = normalizer
        self.version = version
        self.deterministic = deterministic
        self.last_observations: Sequence[Observation] = []
        self.last_units: list[list[float]] = []
        self.last_values: list[float] = []
        self._forward: Callable[..., PolicyOutput] = self.model
        self._net: NumpyNet | None = None
        self._net_key: Any = None
        self._params: list[torch.nn.Parameter] | None = None
        self._unsupported = False
        self._dags = DagCache()

    def compile(self) -> GNNScheduler:
        """Run the forward pass through `torch.compile` (inductor, dynamic shapes).

        The fused kernels make a batch of 256 decisions several times faster on CPU (see
        bench/inference_speed.py), but the first calls compile for tens of seconds, so this
        is opt-in: for long-lived throughput, not for a model that must serve within a
        second of loading. Results match the eager model to float rounding.
        """
        self._forward = torch.compile(self.model, dynamic=True)
        return self

    def place(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        if not cluster.alive.any():
            raise ValueError("no alive node to place on")
        net = self.numpy_net()
        if net is None:
            return self.place_reference(cluster, tasks)
        rng = None
        if not self.deterministic:  # drawn from torch's generator: torch.manual_seed holds
            rng = np.random.default_rng(int(torch.randint(0, 2**62, ()).item()))
        with _one_blas_thread():
            done = place_fast(net, cluster, tasks, rng, self._dags)
        self.last_observations, self.last_units = done.observations, done.units
        self.last_values = done.values
        return done.placements

    def numpy_net(self) -> NumpyNet | None:
        """The model's numpy mirror, rebuilt when a weight or the normalizer changed since
        (training steps write the weights in place); None for a structure it does not know."""
        if self._unsupported:
            return None
        if self._params is None:  # the structure is fixed; the values are what may change
            self._params = list(self.model.parameters())
        params = tuple((p.data_ptr(), p._version) for p in self._params)
        stats = tuple(id(self.normalizer.stats(g)[0]) for g in ("nodes", "cluster", "dag"))
        key = (params, stats)
        if self._net is None or key != self._net_key:
            try:
                self._net = NumpyNet(self.model, self.normalizer)
            except Unsupported as exc:  # served, but by the plain path (several times slower)
                log.warning("policy.fast_path_unsupported", version=self.version, reason=str(exc))
                self._unsupported = True
                return None
            self._net_key = key
        return self._net

    def place_reference(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        """`place` by the plain forward pass: per task, `observe` and the model's heads."""
        if len(tasks) == 1:
            return self.place_observations([observe(cluster, tasks[0])])
        return self._place_in_order(cluster, tasks)

    @torch.no_grad()
    def _place_in_order(self, cluster: ClusterView, tasks: Sequence[TaskView]) -> list[Placement]:
        """One DAG-encoder pass for the whole batch (a task's DAG features do not depend on
        the cluster), then per task, in order: observe the cluster with the earlier
        placements taken, run the heads, take the placement."""
        ranks: dict[int, list[float]] = {}
        dags = []
        for t in tasks:
            key = id(t.workflow)
            if key not in ranks:
                ranks[key] = upward_rank(t.workflow)
            dags.append(dag_features(t, ranks[key]))
        dag_x, edges, dag_batch, this = collate_dags(dags, [t.idx for t in tasks])
        dag_x = self.normalizer.normalize("dag", dag_x)
        encoded = self.model.encode_dag(dag_x, edges, dag_batch, this, len(tasks))

        view = cluster.batch_copy()
        out: list[Placement] = []
        raw: list[Observation] = []
        units: list[list[float]] = []
        values: list[float] = []
        for i, t in enumerate(tasks):
            o = observe(view, t, dag=dags[i])
            result = self.model.heads(
                self.normalizer.normalize("nodes", torch.from_numpy(o.nodes)[None]),
                torch.from_numpy(o.mask)[None],
                self.normalizer.normalize("cluster", torch.from_numpy(o.cluster)[None]),
                encoded[i : i + 1],
                torch.from_numpy(o.anchor)[None],
            )
            (p,) = self._decide(result)
            out.append(p)
            raw.append(o)
            units += self.last_units
            values += self.last_values
            view.take(t, p.node, p.cpu, p.mem)
        self.last_observations, self.last_units, self.last_values = raw, units, values
        return out

    @torch.no_grad()
    def place_observations(self, raw: Sequence[Observation]) -> list[Placement]:
        """Placements for already-built raw observations, in one forward pass."""
        batch = self.normalizer.transform_batch(collate(raw))
        placements = self._decide(self._forward(*batch.args()))
        self.last_observations = list(raw)
        return placements

    def _decide(self, out: PolicyOutput) -> list[Placement]:
        """Actions from the model's outputs; keeps their unit values and the critic's."""
        node, unit, logp = act(out, self.deterministic)
        values = from_unit(unit)
        self.last_units = unit.tolist()
        self.last_values = out.value.tolist()
        return [
            Placement(int(n), float(v[0]), float(v[1]), round(v[2]), float(lp))
            for n, v, lp in zip(node.tolist(), values.tolist(), logp.tolist(), strict=True)
        ]
