"""The actor-critic: a GNN over the task's DAG, a shared per-node scorer, a bounded
continuous head and a value head.

- Encoder: two GATv2 layers over the DAG (edges both ways) with attention pooling, plus
  the embedding of the task being placed; an MLP per cluster node; an MLP over cluster
  and task context.
- A residual over `heft_history` (Silver et al. 2018, "Residual Policy Learning"): the node
  logits are heft_history's own scores (`Observation.base_logits`: -20 x log of its
  estimated finish time) plus a learned scorer over (node, task, cluster) embeddings, so the
  same weights serve 8 or 800 nodes; nodes heft_history would not consider are masked. The
  continuous head gives four Beta distributions (CPU 0.1-0.9, memory 0.2-0.8, retries 1-5,
  priority 0-1) at the chosen node, each centred on heft_history's value there
  (`Observation.base`) moved by a learned shift in logit space (`residual`, exactly 0 for a
  zero shift). The scorer's and the shifts' last layers start at zero, so an untrained
  model decides exactly as heft_history (with its SRPT priority): the same node,
  reservations, retries and priority, task by task, in its batch order
  (`core.heft.heft_order`); learning moves it only where that pays.
- Critic: a value from the task, cluster and mean-node embeddings.

`ACTOR_HEADS` names the parameters online fine-tuning may change; everything else is frozen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Beta, Categorical
from torch_geometric.nn import AttentionalAggregation, GATv2Conv

from dagsched.core.bounds import ACTION_HIGH, ACTION_LOW, ACTION_NAMES, UNIT_LOW, UNIT_SPAN
from dagsched.core.observation import (
    ANCHOR_FLOOR,
    CLUSTER_FEATURES,
    DAG_FEATURES,
    NODE_FEATURES,
)
from dagsched.core.ties import TIE_TOL

ACTOR_HEADS: tuple[str, ...] = ("scorer", "cont_head")
N_CONT = len(ACTION_NAMES)  # CPU, memory, retries, priority
LOW = torch.from_numpy(UNIT_LOW.copy())
SPAN = torch.from_numpy(UNIT_SPAN.copy())
# The Betas' concentration is CONC_SCALE x (2 + softplus(k + 2)). The served means do not
# depend on it; it sets how far a sampled reservation (the learner's exploration) strays. In
# a world where an OOM kill costs an hour's restart, a wide draw of memory (-16%..+22% of the
# mean, p10..p90, at a concentration of ~22) slowed the champion's own workflows by a fifth on
# the shared cluster (docs/concepts/learning.md). Every Beta therefore starts at
# EXPLORE_KAPPA, state-independent: a CPU reservation at its 0.1 floor is drawn within ~+-8%
# (p10..p90), a larger one tighter; learning may widen or narrow it.
CONC_SCALE = 4.0
EXPLORE_KAPPA = 800.0


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the network; stored with every registry version."""

    node_features: int = len(NODE_FEATURES)
    cluster_features: int = len(CLUSTER_FEATURES)
    dag_features: int = len(DAG_FEATURES)
    hidden: int = 64
    heads: int = 2

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.Tanh(), nn.Linear(hidden, out))


@dataclass
class PolicyOutput:
    """Per decision: node logits [B, N] (masked), Beta parameters [B, N, 4, 2], the served
    move of each value from heft_history's in unit space [B, N, 4], value [B]."""

    logits: Tensor
    conc: Tensor
    value: Tensor
    delta: Tensor


def residual(a: Tensor, shift: Tensor) -> Tensor:
    """sigmoid(logit(a) + shift) - a, computed so that a zero shift gives exactly 0: with
    e = exp(-|shift|), a(1-a)(1-e) / (a + (1-a)e) for shift >= 0 and
    -a(1-a)(1-e) / (1-a + a e) below (the same function, without overflow).

    |shift| is written as a `where`, not `abs`: autograd gives `abs` a zero slope at 0, where
    every zero-initialised head starts, and the shifts would never leave it. Through the
    `where` the slope at 0 is a(1-a), the true derivative."""
    mag = torch.where(shift >= 0, shift, -shift)
    e = torch.exp(-mag)
    up = a * (1 - a) * -torch.expm1(-mag)
    return torch.where(shift >= 0, up / (a + (1 - a) * e), -up / (1 - a + a * e))


class ActorCritic(nn.Module):
    """GNN actor-critic with a hybrid action: a node plus three bounded reservations."""

    def __init__(self, cfg: ModelConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg = cfg or ModelConfig()
        h = cfg.hidden
        self.dag_in = nn.Linear(cfg.dag_features, h)
        self.gat1 = GATv2Conv(h, h, heads=cfg.heads, concat=False)
        self.gat2 = GATv2Conv(h, h, heads=cfg.heads, concat=False)
        self.pool = AttentionalAggregation(gate_nn=nn.Linear(h, 1))
        self.node_mlp = _mlp(cfg.node_features, h, h)
        self.cluster_mlp = _mlp(cfg.cluster_features + 2 * h, h, h)
        self.scorer = _mlp(2 * h, h, 1)
        self.cont_head = _mlp(2 * h, h, 2 * N_CONT)
        scorer, cont = self.scorer[-1], self.cont_head[-1]
        assert isinstance(scorer, nn.Linear) and isinstance(cont, nn.Linear)
        with torch.no_grad():  # the residuals start at zero: an untrained model is its base
            scorer.weight.zero_()
            scorer.bias.zero_()
            cont.weight[0::2].zero_()
            cont.bias[0::2].zero_()
            cont.weight[1::2].zero_()  # k with CONC_SCALE x (2 + (k + 2)) = EXPLORE_KAPPA
            cont.bias[1::2].fill_(EXPLORE_KAPPA / CONC_SCALE - 4.0)
        self.critic = _mlp(2 * h, h, 1)

    def forward(
        self,
        nodes: Tensor,  # [B, N, Fn]
        mask: Tensor,  # [B, N] bool
        cluster: Tensor,  # [B, Fc]
        dag_x: Tensor,  # [T, Fd] all DAG tasks of the batch
        dag_edges: Tensor,  # [2, E] (both directions)
        dag_batch: Tensor,  # [T] decision index of each DAG task
        this_task: Tensor,  # [B] index into dag_x of the task being placed
        anchor: Tensor,  # [B, N, 4] heft_history's action per node, in unit action space
        base_logits: Tensor,  # [B, N] heft_history's node scores
    ) -> PolicyOutput:
        dag = self.encode_dag(dag_x, dag_edges, dag_batch, this_task, nodes.shape[0])
        return self.heads(nodes, mask, cluster, dag, anchor, base_logits)

    def encode_dag(
        self, dag_x: Tensor, dag_edges: Tensor, dag_batch: Tensor, this_task: Tensor, size: int
    ) -> Tensor:
        """Per decision, the attention-pooled DAG and the placed task's embedding: [B, 2H].

        The expensive part, and independent of the cluster: a batch placed in order encodes
        its tasks' DAGs once, then runs `heads` per task as the cluster changes."""
        x = torch.tanh(self.dag_in(dag_x))
        x = torch.tanh(self.gat1(x, dag_edges)) + x
        x = torch.tanh(self.gat2(x, dag_edges)) + x
        pooled = self.pool(x, dag_batch, dim_size=size)
        return torch.cat([pooled, x[this_task]], dim=-1)

    def heads(
        self,
        nodes: Tensor,
        mask: Tensor,
        cluster: Tensor,
        dag: Tensor,
        anchor: Tensor,
        base_logits: Tensor,
    ) -> PolicyOutput:
        """Everything after the DAG encoder (`dag` from `encode_dag`): node scores, the
        continuous head and the value."""
        ctx = torch.tanh(self.cluster_mlp(torch.cat([cluster, dag], dim=-1)))
        node_emb = torch.tanh(self.node_mlp(nodes))  # [B, N, H]
        pair = torch.cat([node_emb, ctx[:, None, :].expand_as(node_emb)], dim=-1)
        logits = (self.scorer(pair).squeeze(-1) + base_logits).masked_fill(~mask, -1e9)
        # Beta per value, centred on heft_history's value at that node moved by a learned
        # shift: mean = sigmoid(logit(anchor) + shift) = anchor + residual(anchor, shift),
        # concentration = CONC_SCALE (2 + softplus(k + 2)).
        head = self.cont_head(pair).view(*pair.shape[:2], N_CONT, 2)
        a = anchor.clamp(ANCHOR_FLOOR, 1 - ANCHOR_FLOOR)
        delta = residual(a, head[..., 0])
        mean = (a + delta).clamp(1e-3, 1 - 1e-3)
        kappa = CONC_SCALE * (2.0 + nn.functional.softplus(head[..., 1] + 2.0))
        conc = torch.stack([mean * kappa, (1 - mean) * kappa], dim=-1)
        m = mask.float()[..., None]
        mean_node = (node_emb * m).sum(1) / m.sum(1).clamp(min=1.0)
        value = self.critic(torch.cat([ctx, mean_node], dim=-1)).squeeze(-1)
        return PolicyOutput(logits, conc, value, delta)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The parameters of the actor heads (the node scorer's residual, the continuous head)."""
        return [p for name, p in self.named_parameters() if name.split(".")[0] in ACTOR_HEADS]


def to_unit(values: Tensor) -> Tensor:
    """Map (cpu, mem, retries, priority) to the head's unit space, [0, 1]^4."""
    return ((values - LOW) / SPAN).clamp(1e-4, 1 - 1e-4)


def from_unit(u: Tensor) -> Tensor:
    """Map the head's unit space back to (cpu, mem, retries, priority), unclamped."""
    return LOW + u * SPAN


# The model's outputs are valid by construction: distribution argument checks are skipped,
# they cost more than a batch-of-one forward pass's tail.


def beta_at(out: PolicyOutput, node: Tensor) -> Beta:
    """The continuous distribution at the chosen `node` [B]: three Betas per decision."""
    idx = node.view(-1, 1, 1, 1).expand(-1, 1, N_CONT, 2)
    conc = out.conc.gather(1, idx).squeeze(1)  # [B, 4, 2]
    return Beta(conc[..., 0], conc[..., 1], validate_args=False)


def distributions(out: PolicyOutput, node: Tensor) -> tuple[Categorical, Beta]:
    """The node distribution, and the continuous one at the chosen `node` [B]."""
    return Categorical(logits=out.logits, validate_args=False), beta_at(out, node)


def evaluate(out: PolicyOutput, node: Tensor, unit: Tensor) -> tuple[Tensor, Tensor]:
    """Log-probability and entropy of actions (node [B], unit continuous [B, 4])."""
    cat, beta = distributions(out, node)
    logp = cat.log_prob(node) + beta.log_prob(unit).sum(-1)
    ent = cat.entropy() + beta.entropy().sum(-1)
    return logp, ent


def kl_to_base(
    out: PolicyOutput, base_logits: Tensor, mask: Tensor, anchor: Tensor, node: Tensor
) -> Tensor:
    """KL(policy || base) per decision [B]: over the node choice, plus the continuous values'
    at the taken `node` - the base being heft_history's node scores (the same temperature)
    and Betas centred on its values with the policy's own concentration. 0 for an untrained
    model; the trainer holds it under a budget so learning moves away from a good start
    only as far as the returns pay for."""
    logp = torch.log_softmax(out.logits, -1)
    logq = torch.log_softmax(base_logits.masked_fill(~mask, -1e9), -1)
    node_kl = (logp.exp() * (logp - logq)).masked_fill(~mask, 0.0).sum(-1)
    pol = beta_at(out, node)
    kappa = pol.concentration1 + pol.concentration0
    idx = node.view(-1, 1, 1).expand(-1, 1, N_CONT)
    a = anchor.gather(1, idx).squeeze(1).clamp(ANCHOR_FLOOR, 1 - ANCHOR_FLOOR)
    base = Beta(a * kappa, (1 - a) * kappa, validate_args=False)
    return node_kl + torch.distributions.kl_divergence(pol, base).sum(-1)


def act(out: PolicyOutput, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Choose actions: (node [B], unit continuous [B, 4], log-prob [B]).

    Deterministic: argmax node and the Beta means (serving). Otherwise sampled (training).
    The log-probability is `evaluate`'s, without the entropy it does not need.
    """
    if deterministic:  # the first of (near-)equal best nodes, in float64 as `ties.best_node`
        z = out.logits.double()
        node = (z >= z.max(-1, keepdim=True).values - TIE_TOL).int().argmax(-1)
    else:
        node = Categorical(logits=out.logits, validate_args=False).sample()
    beta = beta_at(out, node)
    unit = (beta.mean if deterministic else beta.sample()).clamp(1e-4, 1 - 1e-4)
    node_logp = torch.log_softmax(out.logits, -1).gather(-1, node[:, None]).squeeze(-1)
    return node, unit, node_logp + beta.log_prob(unit).sum(-1)


def served_delta(out: PolicyOutput, node: Tensor) -> Tensor:
    """The served move of each value from heft_history's at the chosen `node` [B], in unit
    space: [B, 4] (exactly 0 for an untrained head)."""
    idx = node.view(-1, 1, 1).expand(-1, 1, N_CONT)
    return out.delta.gather(1, idx).squeeze(1)


def action_values(
    base: np.ndarray, delta: np.ndarray, unit: np.ndarray, deterministic: bool
) -> tuple[float, float, int, float]:
    """(CPU, memory, retries, priority) of one decision at its node, in their bounds:
    served, heft_history's values at the node (`base`, float32) moved by the head's `delta`
    (unit space), so an untrained head serves exactly the base; sampled, the drawn `unit`."""
    if deterministic:
        v = base.astype(np.float32) + delta.astype(np.float32) * UNIT_SPAN
    else:
        v = UNIT_LOW + unit.astype(np.float32) * UNIT_SPAN
    v = np.clip(v, ACTION_LOW, ACTION_HIGH)
    return float(v[0]), float(v[1]), round(float(v[2])), float(v[3])
