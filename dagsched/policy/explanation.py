"""What an explanation of one decision holds: per-target attributions, their completeness
check, and the views the CLI shows (top contributions, what separated the chosen node from
the runner-up, per-feature sums, a JSON document).

Plain numpy: reading or showing an explanation needs no torch. `dagsched.policy.attribution`
computes one (the method is described there).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dagsched.core.observation import (
    CLUSTER_FEATURES,
    DAG_FEATURES,
    NODE_FEATURES,
    Observation,
)
from dagsched.core.ties import best_node

METHOD = "captum.attr.IntegratedGradients (Gauss-Legendre)"
BASELINE = "zeros in normalised space = the training-mean observation"
DEFAULT_STEPS = 32
TOLERANCE_ABS = 1e-2
TOLERANCE_REL = 1e-2

# target name -> (what it is, unit)
TARGETS: dict[str, tuple[str, str]] = {
    "logit_chosen": ("chosen node's logit", "logit"),
    "logit_runner_up": ("runner-up node's logit", "logit"),
    "logit_gap": ("logit gap, chosen - runner-up", "logit"),
    "cpu": ("CPU reservation (Beta mean at the chosen node)", "fraction of node cores"),
    "mem": ("memory reservation (Beta mean at the chosen node)", "fraction of node memory"),
    "max_retries": ("max retries (Beta mean at the chosen node)", "retries"),
    "priority": ("priority in the node's queue (Beta mean at the chosen node)", "priority"),
    "node_scores": ("sum of alive nodes' logits (per-node heatmap)", "logit"),
}
CORE_TARGETS: tuple[str, ...] = tuple(t for t in TARGETS if t != "node_scores")


class ExplainError(ValueError):
    """The decision cannot be explained (malformed record, node out of range, ...)."""


@dataclass
class Contribution:
    """One input feature's share of one target's change from the baseline."""

    group: str  # "node" | "cluster" | "dag"
    entity: str  # "node 7" / "node-0007", "cluster", "task 3" / "task 3 (this)"
    feature: str
    value: float  # raw (un-normalised) feature value
    contribution: float

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able row, numbers rounded to 6 significant digits."""
        return {
            "group": self.group,
            "entity": self.entity,
            "feature": self.feature,
            "value": _r(self.value),
            "contribution": _r(self.contribution),
        }


@dataclass
class TargetAttribution:
    """Attributions of one target, per group, with its completeness check."""

    name: str
    output: float  # f(x)
    baseline_output: float  # f(baseline)
    nodes: np.ndarray  # [N, Fn]
    cluster: np.ndarray  # [Fc]
    dag: np.ndarray  # [T, Fd]
    captum_delta: float  # Captum's convergence delta (sum(attr) - (f(x) - f(b)))

    @property
    def total(self) -> float:
        """Sum of all attributions (every group)."""
        return float(self.nodes.sum() + self.cluster.sum() + self.dag.sum())

    @property
    def error(self) -> float:
        """|sum(attributions) - (f(x) - f(baseline))|."""
        return abs(self.total - (self.output - self.baseline_output))

    @property
    def tolerance(self) -> float:
        """The largest error completeness allows for this target."""
        return max(TOLERANCE_ABS, TOLERANCE_REL * abs(self.output - self.baseline_output))

    @property
    def complete(self) -> bool:
        """Whether completeness holds within the tolerance."""
        return self.error <= self.tolerance

    def completeness(self) -> dict[str, Any]:
        """The completeness check as a JSON-able record."""
        return {
            "output": _r(self.output),
            "baseline_output": _r(self.baseline_output),
            "sum_attributions": _r(self.total),
            "error": float(f"{self.error:.3g}"),
            "captum_delta": float(f"{self.captum_delta:.3g}"),
            "tolerance": float(f"{self.tolerance:.3g}"),
            "ok": self.complete,
        }


@dataclass
class Explanation:
    """Everything `dagsched explain` shows about one decision."""

    obs: Observation
    chosen: int
    runner_up: int | None
    logits: np.ndarray  # [N] recomputed (dead nodes -1e9)
    values: np.ndarray  # [3] recomputed cpu, mem, retries at the chosen node
    targets: dict[str, TargetAttribution]
    node_ids: list[str] | None = None
    n_steps: int = DEFAULT_STEPS
    meta: dict[str, Any] = field(default_factory=dict)

    # -- naming -------------------------------------------------------------------------------

    def node_name(self, i: int) -> str:
        """Node `i`'s id when known, else `node {i}`."""
        if self.node_ids is not None and 0 <= i < len(self.node_ids):
            return self.node_ids[i]
        return f"node {i}"

    def task_name(self, j: int) -> str:
        """Task `j` of the DAG, marked when it is the task being placed."""
        return f"task {j} (this)" if j == self.obs.task_idx else f"task {j}"

    @property
    def recomputed_choice(self) -> int:
        """The node the model picks now (argmax of the recomputed logits)."""
        return best_node(self.logits)

    @property
    def probabilities(self) -> np.ndarray:
        """Softmax of the logits over alive nodes."""
        z = self.logits - self.logits.max()
        p = np.exp(z) * self.obs.mask
        return p / p.sum()

    @property
    def complete(self) -> bool:
        """Whether completeness holds for every target."""
        return all(t.complete for t in self.targets.values())

    @property
    def max_error(self) -> float:
        """The largest completeness error over the targets."""
        return max((t.error for t in self.targets.values()), default=0.0)

    # -- views --------------------------------------------------------------------------------

    def contributions(self, target: str) -> list[Contribution]:
        """Every (group, entity, feature) contribution to `target`, largest |value| first."""
        t = self.targets[target]
        out: list[Contribution] = []
        for i in range(t.nodes.shape[0]):
            for f, name in enumerate(NODE_FEATURES):
                out.append(
                    Contribution(
                        "node",
                        self.node_name(i),
                        name,
                        float(self.obs.nodes[i, f]),
                        float(t.nodes[i, f]),
                    )
                )
        for f, name in enumerate(CLUSTER_FEATURES):
            out.append(
                Contribution(
                    "cluster", "cluster", name, float(self.obs.cluster[f]), float(t.cluster[f])
                )
            )
        for j in range(t.dag.shape[0]):
            for f, name in enumerate(DAG_FEATURES):
                out.append(
                    Contribution(
                        "dag",
                        self.task_name(j),
                        name,
                        float(self.obs.dag[j, f]),
                        float(t.dag[j, f]),
                    )
                )
        out.sort(key=lambda c: -abs(c.contribution))
        return out

    def top(self, target: str, k: int) -> list[Contribution]:
        """The `k` largest non-zero contributions to `target`."""
        return [c for c in self.contributions(target)[:k] if c.contribution != 0.0]

    def separation(self, k: int) -> list[dict[str, Any]]:
        """What separated the chosen node from the runner-up: per node feature, the chosen
        and runner-up values and the summed contribution of both nodes' values to the gap."""
        if self.runner_up is None:
            return []
        gap = self.targets["logit_gap"]
        c, r = self.chosen, self.runner_up
        rows: list[dict[str, Any]] = [
            {
                "feature": name,
                "chosen_value": _r(float(self.obs.nodes[c, f])),
                "runner_up_value": _r(float(self.obs.nodes[r, f])),
                "contribution": _r(float(gap.nodes[c, f] + gap.nodes[r, f])),
            }
            for f, name in enumerate(NODE_FEATURES)
        ]
        rows.sort(key=lambda x: -abs(x["contribution"]))
        return [x for x in rows[:k] if x["contribution"] != 0.0]

    def shared_gap(self) -> float:
        """The part of the gap attributed to features both nodes share (cluster and DAG)."""
        gap = self.targets["logit_gap"]
        return float(gap.cluster.sum() + gap.dag.sum())

    def per_feature(self, target: str) -> dict[str, float]:
        """|attribution| summed over nodes / tasks, per "group.feature" name."""
        t = self.targets[target]
        out: dict[str, float] = {}
        for f, name in enumerate(NODE_FEATURES):
            out[f"node.{name}"] = float(np.abs(t.nodes[:, f]).sum())
        for f, name in enumerate(CLUSTER_FEATURES):
            out[f"cluster.{name}"] = float(abs(t.cluster[f]))
        for f, name in enumerate(DAG_FEATURES):
            out[f"dag.{name}"] = float(np.abs(t.dag[:, f]).sum())
        return out

    def to_dict(self, top: int = 12) -> dict[str, Any]:
        """The explanation as JSON (`dagsched explain --json`): `top` rows per table."""
        probs = self.probabilities
        units = {"cpu": 0, "mem": 1, "max_retries": 2}

        def node(i: int | None) -> dict[str, Any] | None:
            if i is None:
                return None
            return {
                "index": i,
                "node": self.node_name(i),
                "logit": _r(float(self.logits[i])),
                "probability": _r(float(probs[i])),
            }

        targets: dict[str, Any] = {}
        for name, t in self.targets.items():
            if name == "node_scores":
                continue
            entry: dict[str, Any] = {
                "description": TARGETS[name][0],
                "unit": TARGETS[name][1],
                **t.completeness(),
                "top": [c.to_dict() for c in self.top(name, top)],
            }
            if name in units:
                entry["value"] = _r(float(self.values[units[name]]))
            targets[name] = entry
        out: dict[str, Any] = {
            **self.meta,
            "method": METHOD,
            "baseline": BASELINE,
            "n_steps": self.n_steps,
            "chosen": node(self.chosen),
            "runner_up": node(self.runner_up),
            "recomputed_choice": node(self.recomputed_choice),
            "targets": targets,
            "separation": {
                "gap": _r(float(self.logits[self.chosen] - self.logits[self.runner_up]))
                if self.runner_up is not None
                else None,
                "node_features": self.separation(top),
                "shared_features": _r(self.shared_gap()) if self.runner_up is not None else None,
            },
            "completeness": {
                "rule": "|sum(attr) - (f(x) - f(baseline))| <= "
                f"max({TOLERANCE_ABS:g}, {TOLERANCE_REL:g} * |f(x) - f(baseline)|)",
                "ok": self.complete,
                "max_error": float(f"{self.max_error:.3g}"),
            },
        }
        if "node_scores" in self.targets:
            out["node_heatmap"] = {
                "rows": [self.node_name(i) for i in range(self.obs.nodes.shape[0])],
                "features": list(NODE_FEATURES),
                "contributions": np.round(self.targets["node_scores"].nodes, 5).tolist(),
            }
        return out


def _r(x: float) -> float:
    return float(f"{x:.6g}")
