"""The actor-critic: a GNN over the task's DAG, a shared per-node scorer, a bounded
continuous head and a value head.

- Encoder: two GATv2 layers over the DAG (edges both ways) with attention pooling, plus
  the embedding of the task being placed; an MLP per cluster node; an MLP over cluster
  and task context.
- Actor: one scorer over (node, task, cluster) embeddings gives one logit per cluster node,
  so the same weights serve 8 or 800 nodes; dead nodes are masked. The continuous head gives
  three Beta distributions (CPU 0.1-0.9, memory 0.2-0.8, retries 1-5) conditioned on the
  chosen node: each is centred on the task's demand at that node (its "anchor") shifted by
  a learned amount, so "reserve the demand plus a margin" is easy to learn and a reservation
  far from demand is still reachable.
- Finish prior (optional, `ModelConfig.finish_prior` > 0): the logits get
  -beta x (the node's normalised estimated finish time for this task), so an untrained
  scorer already picks where the task would finish first (HEFT's rule) and learning only has
  to find the corrections (residual policy learning). beta is learned, from that start.
- Critic: a value from the task, cluster and mean-node embeddings.

`ACTOR_HEADS` names the parameters online fine-tuning may change; everything else is frozen.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.distributions import Beta, Categorical
from torch_geometric.nn import AttentionalAggregation, GATv2Conv

from dagsched.core.bounds import ACTION_HIGH, ACTION_LOW
from dagsched.core.observation import (
    ANCHOR_FLOOR,
    CLUSTER_FEATURES,
    DAG_FEATURES,
    NODE_FEATURES,
)
from dagsched.core.ties import TIE_TOL

ACTOR_HEADS: tuple[str, ...] = ("scorer", "cont_head", "prior")
FINISH = NODE_FEATURES.index("log_pred_finish_s")
LOW = torch.from_numpy(ACTION_LOW)
HIGH = torch.from_numpy(ACTION_HIGH)
# The Betas' concentration is CONC_SCALE x (2 + softplus(k + 2)). The served means do not
# depend on it; it sets how far a sampled reservation (the learner's exploration) strays.
# At 1, the retrained champion's (~22) drew memory within -16%..+22% of its mean (p10..p90),
# and in a world where an OOM kill costs an hour's restart the exploring slice's kills
# slowed the champion's own workflows by a fifth on the shared cluster; at 4 it does not
# (README "Exploration that does not hurt the champion").
CONC_SCALE = 4.0


@dataclass(frozen=True)
class ModelConfig:
    """Shapes of the network; stored with every registry version."""

    node_features: int = len(NODE_FEATURES)
    cluster_features: int = len(CLUSTER_FEATURES)
    dag_features: int = len(DAG_FEATURES)
    hidden: int = 64
    heads: int = 2
    finish_prior: float = 0.0  # initial beta of the finish-time prior; 0 = no prior

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _mlp(inp: int, hidden: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, hidden), nn.Tanh(), nn.Linear(hidden, out))


@dataclass
class PolicyOutput:
    """Per decision: node logits [B, N] (masked), Beta parameters [B, N, 3, 2], value [B]."""

    logits: Tensor
    conc: Tensor
    value: Tensor


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
        self.cont_head = _mlp(2 * h, h, 6)
        last = self.cont_head[-1]
        assert isinstance(last, nn.Linear)
        with torch.no_grad():  # an untrained head serves the anchor: history's recommendation
            last.weight[0::2].zero_()
            last.bias[0::2].zero_()
        self.critic = _mlp(2 * h, h, 1)
        self.prior = FinishPrior(cfg.finish_prior) if cfg.finish_prior > 0 else None

    def forward(
        self,
        nodes: Tensor,  # [B, N, Fn]
        mask: Tensor,  # [B, N] bool
        cluster: Tensor,  # [B, Fc]
        dag_x: Tensor,  # [T, Fd] all DAG tasks of the batch
        dag_edges: Tensor,  # [2, E] (both directions)
        dag_batch: Tensor,  # [T] decision index of each DAG task
        this_task: Tensor,  # [B] index into dag_x of the task being placed
        anchor: Tensor,  # [B, N, 3] the task's demand per node, in unit action space
    ) -> PolicyOutput:
        dag = self.encode_dag(dag_x, dag_edges, dag_batch, this_task, nodes.shape[0])
        return self.heads(nodes, mask, cluster, dag, anchor)

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
        self, nodes: Tensor, mask: Tensor, cluster: Tensor, dag: Tensor, anchor: Tensor
    ) -> PolicyOutput:
        """Everything after the DAG encoder (`dag` from `encode_dag`): node scores, the
        continuous head and the value."""
        ctx = torch.tanh(self.cluster_mlp(torch.cat([cluster, dag], dim=-1)))
        node_emb = torch.tanh(self.node_mlp(nodes))  # [B, N, H]
        pair = torch.cat([node_emb, ctx[:, None, :].expand_as(node_emb)], dim=-1)
        logits = self.scorer(pair).squeeze(-1)
        if self.prior is not None:
            logits = logits + self.prior(nodes)
        logits = logits.masked_fill(~mask, -1e9)
        # Beta per value, centred on the task's demand at that node plus a learned shift:
        # mean = sigmoid(logit(anchor) + shift), concentration = CONC_SCALE (2 + softplus(k + 2)).
        head = self.cont_head(pair).view(*pair.shape[:2], 3, 2)
        a = anchor.clamp(ANCHOR_FLOOR, 1 - ANCHOR_FLOOR)
        mean = torch.sigmoid(torch.log(a) - torch.log1p(-a) + head[..., 0]).clamp(1e-3, 1 - 1e-3)
        kappa = CONC_SCALE * (2.0 + nn.functional.softplus(head[..., 1] + 2.0))
        conc = torch.stack([mean * kappa, (1 - mean) * kappa], dim=-1)
        m = mask.float()[..., None]
        mean_node = (node_emb * m).sum(1) / m.sum(1).clamp(min=1.0)
        value = self.critic(torch.cat([ctx, mean_node], dim=-1)).squeeze(-1)
        return PolicyOutput(logits, conc, value)

    def actor_parameters(self) -> list[nn.Parameter]:
        """The parameters of the actor heads (node scorer, its finish prior, continuous head)."""
        return [p for name, p in self.named_parameters() if name.split(".")[0] in ACTOR_HEADS]


class FinishPrior(nn.Module):
    """-beta x the normalised `log_finish_s` node feature, with beta > 0 learned in log space."""

    def __init__(self, beta: float) -> None:
        super().__init__()
        self.log_beta = nn.Parameter(torch.tensor(math.log(beta)))

    def forward(self, nodes: Tensor) -> Tensor:
        return -self.log_beta.exp() * nodes[..., FINISH]


def to_unit(values: Tensor) -> Tensor:
    """Map (cpu, mem, retries) in their bounds to [0, 1]^3."""
    return ((values - LOW) / (HIGH - LOW)).clamp(1e-4, 1 - 1e-4)


def from_unit(u: Tensor) -> Tensor:
    """Map [0, 1]^3 back to (cpu, mem, retries) in their bounds."""
    return LOW + u * (HIGH - LOW)


# The model's outputs are valid by construction: distribution argument checks are skipped,
# they cost more than a batch-of-one forward pass's tail.


def beta_at(out: PolicyOutput, node: Tensor) -> Beta:
    """The continuous distribution at the chosen `node` [B]: three Betas per decision."""
    idx = node.view(-1, 1, 1, 1).expand(-1, 1, 3, 2)
    conc = out.conc.gather(1, idx).squeeze(1)  # [B, 3, 2]
    return Beta(conc[..., 0], conc[..., 1], validate_args=False)


def distributions(out: PolicyOutput, node: Tensor) -> tuple[Categorical, Beta]:
    """The node distribution, and the continuous one at the chosen `node` [B]."""
    return Categorical(logits=out.logits, validate_args=False), beta_at(out, node)


def evaluate(out: PolicyOutput, node: Tensor, unit: Tensor) -> tuple[Tensor, Tensor]:
    """Log-probability and entropy of actions (node [B], unit continuous [B, 3])."""
    cat, beta = distributions(out, node)
    logp = cat.log_prob(node) + beta.log_prob(unit).sum(-1)
    ent = cat.entropy() + beta.entropy().sum(-1)
    return logp, ent


def act(out: PolicyOutput, deterministic: bool) -> tuple[Tensor, Tensor, Tensor]:
    """Choose actions: (node [B], unit continuous [B, 3], log-prob [B]).

    Deterministic: argmax node and the Beta means (serving). Otherwise sampled (training).
    The log-probability is `evaluate`'s, without the entropy it does not need.
    """
    if deterministic:  # the first of (near-)equal best nodes, as `ties.best_node`
        best = out.logits.max(-1, keepdim=True).values
        node = (out.logits >= best - TIE_TOL).int().argmax(-1)
    else:
        node = Categorical(logits=out.logits, validate_args=False).sample()
    beta = beta_at(out, node)
    unit = (beta.mean if deterministic else beta.sample()).clamp(1e-4, 1 - 1e-4)
    node_logp = torch.log_softmax(out.logits, -1).gather(-1, node[:, None]).squeeze(-1)
    return node, unit, node_logp + beta.log_prob(unit).sum(-1)
