"""`GNNScheduler`: the trained actor-critic behind the `Scheduler` contract."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, overload

import numpy as np
import structlog
import torch
from threadpoolctl import ThreadpoolController

from dagsched.core.bounds import to_unit
from dagsched.core.heft import heft_order
from dagsched.core.observation import Observation, dag_features, observe
from dagsched.core.scheduler import Placement
from dagsched.core.view import ClusterView, TaskView
from dagsched.core.workflow import upward_rank
from dagsched.policy.collate import collate, collate_dags
from dagsched.policy.fast_place import place_fast
from dagsched.policy.model import ActorCritic, PolicyOutput, act, action_values, served_delta
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

    `place` puts them one by one, in heft_history's order (`core.heft.heft_order`: its base
    is heft_history's rule, its batch order included), each observing the cluster with the
    batch's earlier placements taken, as HEFT and the daemon's accounting do: from one
    snapshot, a scatter of 20 ready siblings would see 20 identical clusters and pile onto
    one node. Placements and `last_observations` come back in the order given. It runs the
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
        self._encoding_rows: int | None = None  # None: `Encodings`' default

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its model, normalizer, version and mode: a copy starts with empty
        caches and the eager forward pass (replays in worker processes)."""
        return (GNNScheduler, (self.model, self.normalizer, self.version, self.deterministic))

    def bound_caches(self, dag_rows: int, encoding_rows: int) -> GNNScheduler:
        """Bound what this scheduler keeps across batches, in task rows: the DAG inputs
        (`DagCache`) and the encoded DAGs of its numpy mirror (`Encodings`); the daemon's
        `daemon.caches`. Least recently used out from the next entry on."""
        self._dags.max_rows = dag_rows
        self._encoding_rows = encoding_rows
        if self._net is not None:
            self._net.encodings.max_rows = encoding_rows
        return self

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
        order = heft_order(tasks)
        with _one_blas_thread():
            done = place_fast(net, cluster, [tasks[i] for i in order], rng, self._dags)
        back = _inverse(order)
        self.last_observations = InOrder(done.observations, back)
        self.last_units = [done.units[k] for k in back]
        self.last_values = [done.values[k] for k in back]
        return [done.placements[k] for k in back]

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
                if self._encoding_rows is not None:
                    self._net.encodings.max_rows = self._encoding_rows
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
        order = heft_order(tasks)
        placed = self._place_in_order(cluster, [tasks[i] for i in order])
        back = _inverse(order)
        self.last_observations = [self.last_observations[k] for k in back]
        self.last_units = [self.last_units[k] for k in back]
        self.last_values = [self.last_values[k] for k in back]
        return [placed[k] for k in back]

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
                torch.from_numpy(to_unit(o.base))[None],
                torch.from_numpy(o.base_logits)[None],
            )
            (p,) = self._decide(result, [o.base])
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
        placements = self._decide(self._forward(*batch.args()), [o.base for o in raw])
        self.last_observations = list(raw)
        return placements

    def _decide(self, out: PolicyOutput, bases: Sequence[np.ndarray]) -> list[Placement]:
        """Actions from the model's outputs and each decision's heft_history action per node
        (`bases`); keeps their unit values and the critic's."""
        node, unit, logp = act(out, self.deterministic)
        delta = served_delta(out, node).numpy()
        units = unit.numpy()
        self.last_units = unit.tolist()
        self.last_values = out.value.tolist()
        placements = []
        for i, (n, lp) in enumerate(zip(node.tolist(), logp.tolist(), strict=True)):
            cpu, mem, retries, priority = action_values(
                bases[i][n], delta[i], units[i], self.deterministic
            )
            placements.append(Placement(int(n), cpu, mem, retries, float(lp), priority))
        return placements


def _inverse(order: Sequence[int]) -> list[int]:
    """`back` with `placed[back[i]]` the result for input `i`, where `placed` is in `order`."""
    back = [0] * len(order)
    for k, i in enumerate(order):
        back[i] = k
    return back


class InOrder(Sequence[Observation]):
    """A sequence read through an index map (observations built when read stay lazy)."""

    def __init__(self, inner: Sequence[Observation], index: Sequence[int]) -> None:
        self.inner, self.order = inner, index

    def __len__(self) -> int:
        return len(self.order)

    @overload
    def __getitem__(self, i: int) -> Observation: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Observation]: ...
    def __getitem__(self, i: int | slice) -> Observation | Sequence[Observation]:
        if isinstance(i, slice):
            return [self.inner[self.order[k]] for k in range(len(self.order))[i]]
        return self.inner[self.order[i]]
