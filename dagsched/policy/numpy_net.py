"""The actor-critic's weights as numpy arrays, for the served fast path (`fast_place`).

`ActorCritic` is small (hidden 64): per decision its torch forward pass is ~60 operations on
tiny tensors, and torch's per-operation overhead, not arithmetic, is what it costs. Here the
same network runs in numpy, with the first layers split where their input is a
concatenation, so that the part of a sum that does not change is computed once:

- the scorer and the continuous head take (node embedding, context): their first layer is
  `node @ Wn + ctx @ Wc + b`, so the node part is computed once per batch for every
  (task, node) pair and a task's logits are `tanh(node part + its context part) @ w2`;
- the cluster MLP takes (cluster features, DAG encoding): the DAG part once per batch;
- the critic takes (context, mean node embedding).

The DAG encoder (two GATv2 layers with self loops, attention pooling) is PyG's arithmetic
over one edge list for the batch, sorted by destination: the linear maps in numpy, the edge
scores, segment softmax and attention-weighted sums compiled (`encoder_kernel`). Everything
is float32 like the torch model; results agree with it to float rounding, which
`tests/policy/test_fast_exact.py` checks decision by decision.

`NumpyNet(model, normalizer)` refuses (raises `Unsupported`) a model whose structure is not
the one this file mirrors, so a changed architecture falls back to the plain forward pass
instead of serving different numbers.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from torch import Tensor, nn
from torch_geometric.nn import AttentionalAggregation, GATv2Conv

from dagsched.policy.encoder_kernel import gat_edges, pool_rows
from dagsched.policy.model import N_CONT, ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer

F32 = np.float32
_NEG_SLOPE = 0.2


class Unsupported(ValueError):
    """A model whose structure the numpy mirror does not reproduce."""


def _a(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().cpu().numpy().astype(F32))


@dataclass(frozen=True)
class Dense:
    """y = x @ w + b, with `w` [in, out] (the torch weight transposed)."""

    w: np.ndarray
    b: np.ndarray

    @classmethod
    def of(cls, lin: nn.Module) -> Dense:
        # torch's Linear or PyG's (the same F.linear)
        w, b = getattr(lin, "weight", None), getattr(lin, "bias", None)
        linear = isinstance(lin, nn.Linear) or type(lin).__name__ == "Linear"
        if not (linear and isinstance(w, Tensor) and isinstance(b, Tensor) and w.dim() == 2):
            raise Unsupported(f"expected a Linear with bias, got {lin!r}")
        return cls(_a(w).T.copy(), _a(b))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        if x.ndim > 2:  # one matrix product, not one per leading index
            return (x.reshape(-1, x.shape[-1]) @ self.w + self.b).reshape(*x.shape[:-1], -1)
        return x @ self.w + self.b


def _mlp(seq: nn.Module) -> tuple[Dense, Dense]:
    """The two Linear layers of `Linear, Tanh, Linear`."""
    if not (isinstance(seq, nn.Sequential) and len(seq) == 3 and isinstance(seq[1], nn.Tanh)):
        raise Unsupported(f"expected Linear-Tanh-Linear, got {seq!r}")
    return Dense.of(seq[0]), Dense.of(seq[2])


@dataclass(frozen=True)
class Gat:
    """One GATv2Conv (heads averaged, self loops, no edge features, bias after the mean)."""

    left: Dense
    right: Dense
    att: np.ndarray  # [heads, C]
    bias: np.ndarray  # [C]
    heads: int

    @classmethod
    def of(cls, conv: nn.Module) -> Gat:
        if not isinstance(conv, GATv2Conv):
            raise Unsupported(f"not a GATv2 layer: {conv!r}")
        ok = (
            not conv.concat
            and conv.add_self_loops
            and not conv.share_weights
            and conv.edge_dim is None
            and getattr(conv, "res", None) is None
            and conv.negative_slope == _NEG_SLOPE
            and conv.bias is not None
        )
        if not ok:
            raise Unsupported(f"GATv2 layer not mirrored: {conv!r}")
        att, bias = conv.att, conv.bias
        assert isinstance(att, Tensor) and isinstance(bias, Tensor)
        a = np.ascontiguousarray(_a(att)[0])
        return cls(Dense.of(conv.lin_l), Dense.of(conv.lin_r), a, _a(bias), a.shape[0])

    def __call__(self, x: np.ndarray, graph: Graph) -> np.ndarray:
        t, h = x.shape[0], self.heads
        xl = self.left(x).reshape(t, h, -1)
        xr = self.right(x).reshape(t, h, -1)
        out = np.empty((t, xl.shape[2]), dtype=F32)
        gat_edges(xl, xr, graph.src, graph.starts, self.att, F32(_NEG_SLOPE), out)
        return out + self.bias


@dataclass(frozen=True)
class Graph:
    """A batch of DAGs as an edge list sorted by destination, self loops included: every
    node has at least one in-edge, so `starts` (its first in-edge) defines the segments."""

    src: np.ndarray  # [E]: each edge's source; its destination is the segment it is in
    starts: np.ndarray  # [T]


def batch_graph(parts: Sequence[tuple[int, np.ndarray, np.ndarray]]) -> tuple[Graph, np.ndarray]:
    """The union of DAGs given as (size, src, dst) (`batch_observation.in_edges`: edges both
    ways and self loops, sorted by destination), and each DAG's first row."""
    sizes = np.array([p[0] for p in parts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    src = np.concatenate([s + o for (_, s, _), o in zip(parts, offsets, strict=True)])
    dst = np.concatenate([d + o for (_, _, d), o in zip(parts, offsets, strict=True)])
    counts = np.bincount(dst, minlength=int(sizes.sum()))
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return Graph(src, starts), offsets


class Encodings:
    """Encoded DAGs kept across batches: per DAG input (`batch_observation.DagKey`: a
    workflow at a state), its pooled encoding [H] and task embeddings [T, H]. A map stage's
    siblings arrive over many batches with their workflow unchanged: it is encoded once.
    Holds each workflow object so its id is not reused; least recently used out beyond
    `max_rows` task rows (256 bytes each at hidden 64: ~25 MB at the default). Belongs to
    one `NumpyNet` (one set of weights)."""

    def __init__(self, max_rows: int = 100_000) -> None:
        self.max_rows = max_rows
        self.rows = 0
        self._entries: OrderedDict[Hashable, tuple[object, np.ndarray, np.ndarray]] = OrderedDict()

    def get(self, key: Hashable, owner: object) -> tuple[np.ndarray, np.ndarray] | None:
        hit = self._entries.get(key)
        if hit is None or hit[0] is not owner:
            return None
        self._entries.move_to_end(key)
        return hit[1], hit[2]

    def clear(self) -> None:
        self._entries.clear()
        self.rows = 0

    def put(self, key: Hashable, owner: object, pooled: np.ndarray, x: np.ndarray) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.rows -= old[2].shape[0]
        self._entries[key] = (owner, pooled, x)
        self.rows += x.shape[0]
        while self.rows > self.max_rows and len(self._entries) > 1:
            _, (_, _, gone) = self._entries.popitem(last=False)
            self.rows -= gone.shape[0]


class NumpyNet:
    """`ActorCritic` and its `FeatureNormalizer` as float32 numpy arrays (see module doc)."""

    def __init__(self, model: ActorCritic, normalizer: FeatureNormalizer) -> None:
        if type(model) is not ActorCritic:
            raise Unsupported(f"not an ActorCritic: {type(model).__name__}")
        names = {n.split(".")[0] for n, _ in model.named_parameters()}
        known = {
            "dag_in", "gat1", "gat2", "pool", "node_mlp", "cluster_mlp", "scorer", "cont_head",
            "critic",
        }  # fmt: skip
        if not names <= known:
            raise Unsupported(f"parameters not mirrored: {sorted(names - known)}")
        h = model.cfg.hidden
        self.hidden = h
        self.encodings = Encodings()
        self.dag_in = Dense.of(model.dag_in)
        self.gat1, self.gat2 = Gat.of(model.gat1), Gat.of(model.gat2)
        pool = model.pool
        if not isinstance(pool, AttentionalAggregation) or pool.nn is not None:
            raise Unsupported("attention pooling not mirrored")
        if getattr(pool, "gate_mlp", None) is not None or getattr(pool, "mlp", None) is not None:
            raise Unsupported("attention pooling not mirrored")
        self.gate = Dense.of(pool.gate_nn)
        self.node1, self.node2 = _mlp(model.node_mlp)
        cl1, self.cl2 = _mlp(model.cluster_mlp)
        fc = model.cfg.cluster_features
        self.cl1_cluster, self.cl1_dag = cl1.w[:fc], cl1.w[fc:]
        self.cl1_b = cl1.b
        sc1, self.sc2 = _mlp(model.scorer)
        self.sc1_node, self.sc1_ctx, self.sc1_b = sc1.w[:h], sc1.w[h:], sc1.b
        co1, self.co2 = _mlp(model.cont_head)
        self.co1_node, self.co1_ctx, self.co1_b = co1.w[:h], co1.w[h:], co1.b
        cr1, self.cr2 = _mlp(model.critic)
        self.cr1_ctx, self.cr1_mean, self.cr1_b = cr1.w[:h], cr1.w[h:], cr1.b
        self.ctx_w = np.ascontiguousarray(np.hstack([self.sc1_ctx, self.co1_ctx, self.cr1_ctx]))
        if self.co2.w.shape[1] != 2 * N_CONT:
            raise Unsupported(f"continuous head of {self.co2.w.shape[1]} outputs")
        self.norm = {}
        for g in ("nodes", "cluster", "dag"):
            mean, inv = normalizer.stats(g)
            self.norm[g] = (mean.astype(F32), inv.astype(F32))

    def normalize(self, group: str, x: np.ndarray) -> np.ndarray:
        """As `FeatureNormalizer.normalize`, in float32: the same numbers, bit for bit."""
        mean, inv = self.norm[group]
        return np.clip((x.astype(F32, copy=False) - mean) * inv, F32(-10.0), F32(10.0))

    # -- the DAG encoder ----------------------------------------------------------------------

    def encode_graphs(
        self, dag_x: np.ndarray, graph: Graph, firsts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The DAG encoder over D DAGs in one graph: each DAG's attention-pooled encoding
        [D, H] and every task's embedding [T, H]. `dag_x` raw DAG features [T, F]; `firsts`
        each DAG's first row. (A decision reads its DAG's pooled row and its task's row.)"""
        x = np.tanh(self.dag_in(self.normalize("dag", dag_x)))
        x = np.tanh(self.gat1(x, graph)) + x
        x = np.tanh(self.gat2(x, graph)) + x
        gate = self.gate(x)[:, 0]  # [T]
        sizes = np.diff(np.append(firsts, x.shape[0]))
        owner = np.repeat(np.arange(len(firsts)), sizes)
        top = np.maximum.reduceat(gate, firsts)
        ex = np.exp(gate - top[owner])
        w = ex / (np.add.reduceat(ex, firsts)[owner] + F32(1e-16))
        pooled = np.empty((firsts.size, x.shape[1]), dtype=F32)
        pool_rows(w, x, firsts, pooled)
        return pooled, x

    # -- the heads, split ---------------------------------------------------------------------

    def node_embed(self, xn: np.ndarray) -> np.ndarray:
        """The per-node MLP on normalised node features [..., Fn] -> [..., H] (in place on
        its intermediates: at 2,048 nodes x 64 tasks they are 30 MB each)."""
        flat = xn.reshape(-1, xn.shape[-1])
        h = flat @ self.node1.w
        h += self.node1.b
        np.tanh(h, out=h)
        out = h @ self.node2.w
        out += self.node2.b
        np.tanh(out, out=out)
        return out.reshape(*xn.shape[:-1], -1)

    def scorer_node_part(self, emb: np.ndarray) -> np.ndarray:
        """The node half of the scorer's first layer, bias included: [..., H]."""
        flat = emb.reshape(-1, emb.shape[-1]) @ self.sc1_node
        flat += self.sc1_b
        return flat.reshape(emb.shape)

    def context(self, cluster_n: np.ndarray, dag_part: np.ndarray) -> np.ndarray:
        """The cluster MLP on normalised cluster features and `dag_part` (the DAG encoding
        times `cl1_dag`, once per batch): [H]."""
        return np.tanh(self.cl2(np.tanh(cluster_n @ self.cl1_cluster + dag_part + self.cl1_b)))

    def base_part(self, base_logits: np.ndarray) -> np.ndarray:
        """What the logits add to the scorer's residual per node: its output bias and
        heft_history's node scores (`Observation.base_logits`, [...]), float32."""
        out = np.full(base_logits.shape, self.sc2.b[0], dtype=F32)
        out += base_logits
        return out

    def context_parts(self, ctx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The context's halves of the scorer's, the continuous head's and the critic's
        first layers, as one product."""
        h = self.hidden
        both = ctx @ self.ctx_w
        return both[:h], both[h : 2 * h], both[2 * h :]

    def logits(self, node_part: np.ndarray, ctx_part: np.ndarray, prior: np.ndarray) -> np.ndarray:
        """Unmasked node logits [n] from the node parts [n, H], the context's part and the
        base part [n]."""
        return np.tanh(node_part + ctx_part) @ self.sc2.w[:, 0] + prior

    def cont_raw(self, emb: np.ndarray, ctx_part: np.ndarray) -> np.ndarray:
        """The continuous head at one node: [8] = (shift, concentration) per value."""
        return self.co2(np.tanh(emb @ self.co1_node + ctx_part + self.co1_b))

    def value(self, ctx_part: np.ndarray, mean_node: np.ndarray) -> float:
        """The critic from the context's part and the candidate nodes' mean embedding."""
        z = np.tanh(ctx_part + mean_node @ self.cr1_mean + self.cr1_b)
        return float(self.cr2(z)[0])
