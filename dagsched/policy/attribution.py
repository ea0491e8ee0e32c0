"""Explain one decision: attribute the model's outputs to named input features.

Method: Captum's `IntegratedGradients` on the *normalised* inputs (node features [N, Fn],
cluster features [Fc], the DAG's task features [T, Fd]), from a baseline of zeros in
normalised space, which is the training-mean observation (the normalizer is a StandardScaler
fitted with the model). The discrete parts of the observation (DAG edges, which task is being
placed, the alive mask, the demand anchor of the continuous head) are held fixed and passed as
additional forward arguments - except heft_history's node scores, the base of the node
logits, which move with the node's estimated-finish feature they are computed from - so the
attributions answer "how did the feature *values* of this
observation move the output away from what the model outputs for an average observation".

Targets, all recomputed with the model version that made the decision:

- `logit_chosen`, `logit_runner_up`: the chosen node's and the runner-up node's logits;
- `logit_gap`: chosen minus runner-up (what separated them);
- `cpu`, `mem`, `max_retries`: the continuous head's Beta means at the chosen node, in real
  units (fraction of node cores, fraction of node memory, retries 1-5);
- `node_scores` (optional, for the heatmap): the sum of all alive nodes' logits. Node i's
  logit depends on node i's own features only (one shared per-node scorer), so the node-feature
  attributions of this sum are, row by row, each node's attribution of its *own* logit.

All targets are attributed in one batched Captum call (the observation is repeated once per
target, with one target index per copy); the gap is the chosen logit's attribution minus the
runner-up's, which is exact because IG is linear in the attributed function. Completeness
(the IG axiom) is checked for every target:

    |sum(attr) - (f(x) - f(baseline))| <= max(TOLERANCE_ABS, TOLERANCE_REL * |f(x) - f(base)|)

with Gauss-Legendre quadrature and `DEFAULT_STEPS` steps (32: the error measured on the
shipped champion is ~1e-5, far inside the tolerance, and 64 steps cost about twice the time).

No Kafka, no Redis, no CLI and no drawing here: callers hand in an `Observation` and a
model; the result types (`Explanation`, the targets and tolerances) are in
`dagsched.policy.explanation`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from captum.attr import IntegratedGradients
from torch import Tensor

from dagsched.core.bounds import to_unit
from dagsched.core.demand import FINISH_BETA
from dagsched.core.observation import FINISH, Observation
from dagsched.core.ties import best_node
from dagsched.policy.explanation import (
    CORE_TARGETS,
    DEFAULT_STEPS,
    TARGETS,
    ExplainError,
    Explanation,
    TargetAttribution,
)
from dagsched.policy.model import ActorCritic, from_unit
from dagsched.policy.normalizer import FeatureNormalizer


@dataclass(frozen=True)
class _DagShape:
    """The DAG's structure for one decision. Not a tensor, so Captum passes it through
    unexpanded; the forward replicates it once per batch row."""

    edges: Tensor  # [2, E] both directions
    n_tasks: int
    task_idx: int


def runner_up_of(logits: np.ndarray, mask: np.ndarray, chosen: int) -> int | None:
    """The alive node with the highest logit other than `chosen`, or None."""
    cand = np.where(mask, logits, -np.inf)
    cand[chosen] = -np.inf
    best = int(np.argmax(cand))
    return best if np.isfinite(cand[best]) else None


def _forward(
    model: ActorCritic, chosen: int, runner_up: int, names: Sequence[str], finish_slope: float
) -> Any:
    """f(nodes [k,N,Fn], cluster [k,Fc], dag [k,T,Fd], mask, anchor, base logits, the
    observation's normalised finish column, shape) -> [k, targets]."""
    col = {name: i for i, name in enumerate(names)}

    def f(
        nodes: Tensor,
        cluster: Tensor,
        dag: Tensor,
        mask: Tensor,
        anchor: Tensor,
        base_logits: Tensor,
        finish0: Tensor,
        shape: _DagShape,
    ) -> Tensor:
        # heft_history's node scores are -beta x the estimated finish feature: moved with
        # it (linear, exact at the observation), so the base's part of a choice is
        # attributed to `log_pred_finish_s` rather than held fixed
        base_logits = base_logits + finish_slope * (nodes[..., FINISH] - finish0)
        k, t = dag.shape[0], dag.shape[1]
        off = torch.arange(k) * t
        edges = (shape.edges[:, None, :] + off[None, :, None]).reshape(2, -1)
        batch = torch.arange(k).repeat_interleave(t)
        out = model(
            nodes,
            mask,
            cluster,
            dag.reshape(k * t, -1),
            edges,
            batch,
            off + shape.task_idx,
            anchor,
            base_logits,
        )
        logits = out.logits
        mean = out.conc[..., 0] / out.conc.sum(-1)  # [k, N, 4] Beta means in unit space
        values = from_unit(mean[:, chosen])  # [k, 4] real units
        cols = {
            "logit_chosen": logits[:, chosen],
            "logit_runner_up": logits[:, runner_up],
            "logit_gap": logits[:, chosen] - logits[:, runner_up],
            "cpu": values[:, 0],
            "mem": values[:, 1],
            "max_retries": values[:, 2],
            "priority": values[:, 3],
            "node_scores": torch.where(mask, logits, torch.zeros_like(logits)).sum(1),
        }
        return torch.stack([cols[n] for n in sorted(col, key=col.__getitem__)], dim=1)

    return f


def explain_observation(
    model: ActorCritic,
    normalizer: FeatureNormalizer,
    obs: Observation,
    chosen: int | None = None,
    *,
    targets: Iterable[str] = (*CORE_TARGETS, "node_scores"),
    n_steps: int = DEFAULT_STEPS,
    node_ids: Sequence[str] | None = None,
) -> Explanation:
    """Attribute the model's outputs for one raw observation (see the module docstring).

    `chosen` is the node the decision logged (default: the model's argmax now).
    """
    n = obs.nodes.shape[0]
    if obs.mask.shape != (n,) or not obs.mask.any():
        raise ExplainError("observation has no alive node")
    if not (0 <= obs.task_idx < obs.dag.shape[0]):
        raise ExplainError(f"task index {obs.task_idx} outside the DAG's {obs.dag.shape[0]} tasks")
    norm = normalizer.transform(obs)
    nodes = torch.from_numpy(np.ascontiguousarray(norm.nodes, dtype=np.float32))[None]
    cluster = torch.from_numpy(np.ascontiguousarray(norm.cluster, dtype=np.float32))[None]
    dag = torch.from_numpy(np.ascontiguousarray(norm.dag, dtype=np.float32))[None]
    mask = torch.from_numpy(np.asarray(obs.mask, dtype=bool))[None]
    anchor = torch.from_numpy(to_unit(obs.base))[None]
    base_logits = torch.from_numpy(np.asarray(obs.base_logits, dtype=np.float32))[None]
    edges = torch.from_numpy(np.asarray(obs.edges, dtype=np.int64).reshape(2, -1))
    shape = _DagShape(torch.cat([edges, edges.flip(0)], dim=1), dag.shape[1], obs.task_idx)

    model = model.eval()
    with torch.no_grad():
        out = model(
            nodes,
            mask,
            cluster,
            dag[0],
            shape.edges,
            torch.zeros(dag.shape[1], dtype=torch.long),
            torch.tensor([obs.task_idx]),
            anchor,
            base_logits,
        )
        logits = out.logits[0].numpy().astype(np.float64)
    if chosen is None:
        chosen = best_node(logits)
    if not (0 <= chosen < n):
        raise ExplainError(f"chosen node index {chosen} outside the observation's {n} nodes")
    runner_up = runner_up_of(logits, obs.mask, chosen)

    wanted = [t for t in TARGETS if t in set(targets)]
    if runner_up is None:  # one alive node: nothing to compare it with
        wanted = [t for t in wanted if t not in ("logit_runner_up", "logit_gap")]
    # IG is linear in the target: the gap's attributions are exactly the chosen logit's minus
    # the runner-up's (same path, same quadrature points), so it costs no extra copy.
    names = [t for t in wanted if t != "logit_gap"]
    if "logit_gap" in wanted:
        names += [t for t in ("logit_chosen", "logit_runner_up") if t not in names]
    _, inv = normalizer.stats("nodes")
    slope = float(-FINISH_BETA / inv[FINISH])  # d(base logit) / d(normalised finish)
    f = _forward(model, chosen, runner_up if runner_up is not None else chosen, names, slope)
    k = len(names)
    inputs = (
        nodes.expand(k, -1, -1).contiguous(),
        cluster.expand(k, -1).contiguous(),
        dag.expand(k, -1, -1).contiguous(),
    )
    baselines = tuple(torch.zeros_like(x) for x in inputs)
    extra = (
        mask.expand(k, -1).contiguous(),
        anchor.expand(k, -1, -1).contiguous(),
        base_logits.expand(k, -1).contiguous(),
        nodes[..., FINISH].expand(k, -1).contiguous(),
        shape,
    )
    ig = IntegratedGradients(f)
    attrs, delta = ig.attribute(
        inputs,
        baselines=baselines,
        target=list(range(k)),
        additional_forward_args=extra,
        n_steps=n_steps,
        method="gausslegendre",
        return_convergence_delta=True,
    )
    with torch.no_grad():
        fx = f(*inputs, *extra).diagonal().double().numpy()
        fb = f(*baselines, *extra).diagonal().double().numpy()
        # Beta means at the chosen node, whichever targets were asked
        mean = out.conc[0, chosen, :, 0] / out.conc[0, chosen].sum(-1)
        real = from_unit(mean[None])[0].double().numpy()
    result = {
        name: TargetAttribution(
            name=name,
            output=float(fx[i]),
            baseline_output=float(fb[i]),
            nodes=attrs[0][i].detach().double().numpy(),
            cluster=attrs[1][i].detach().double().numpy(),
            dag=attrs[2][i].detach().double().numpy(),
            captum_delta=float(delta[i]),
        )
        for i, name in enumerate(names)
    }
    if "logit_gap" in wanted:
        c, r = result["logit_chosen"], result["logit_runner_up"]
        result["logit_gap"] = TargetAttribution(
            name="logit_gap",
            output=c.output - r.output,
            baseline_output=c.baseline_output - r.baseline_output,
            nodes=c.nodes - r.nodes,
            cluster=c.cluster - r.cluster,
            dag=c.dag - r.dag,
            captum_delta=c.captum_delta - r.captum_delta,
        )
    result = {name: result[name] for name in TARGETS if name in result and name in wanted}
    return Explanation(
        obs=obs,
        chosen=chosen,
        runner_up=runner_up,
        logits=logits,
        values=real,
        targets=result,
        node_ids=list(node_ids) if node_ids is not None else None,
        n_steps=n_steps,
    )
