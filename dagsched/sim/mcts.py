"""A Monte-Carlo tree search planner over the simulator's own state — the classic yardstick
for learned DAG schedulers, and an expensive one.

For each ready task the root's children are the `candidates` nodes with the earliest
estimated finish (HEFT's estimate); UCT (UCB1 with exploration `c`) spends a fixed budget of
`budget` rollouts among them. A rollout deep-copies the simulator, places the task on the
child's node (reserving its demand), then plays `horizon` more decisions with least-loaded;
its value is the reward earned meanwhile plus a penalty for work still unfinished. The
planner's decision time is part of what it reports.

This is a one-level tree (the children of the root are leaves evaluated by rollouts), the
usual "UCT with rollouts" baseline for placement at this budget; deeper trees over the
branching factor of real clusters did not fit a per-decision budget.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from dagsched.sim.baselines import (
    DEFAULT_RETRIES,
    BatchView,
    Demand,
    LeastLoadedPolicy,
    earliest_finish_node,
)
from dagsched.sim.runs import Decision, TaskRun

if TYPE_CHECKING:
    from dagsched.sim.engine import Simulator


class MCTSPolicy:
    """UCT over candidate nodes with simulator rollouts."""

    name = "mcts"

    def __init__(
        self,
        budget: int = 8,
        candidates: int = 3,
        horizon: int = 24,
        c: float = 1.4,
        horizon_s: float = 1800.0,
    ) -> None:
        if budget < 1 or candidates < 1 or horizon < 1:
            raise ValueError("budget, candidates and horizon must be >= 1")
        self.budget, self.k, self.horizon, self.c = budget, candidates, horizon, c
        self.horizon_s = horizon_s
        self.rollout_policy = LeastLoadedPolicy()

    def decide(self, sim: Simulator, ready: list[TaskRun]) -> list[Decision]:
        view = BatchView(sim)
        out: list[Decision] = []
        for t in sorted(ready, key=lambda t: -t.run.upward_rank()[t.idx]):
            d = Demand(sim, t)
            node = self._search(sim, t, d, view, out)
            out.append(d.decision(t, node))
            view.take(sim, node, d, t)
        return out

    def _candidates(self, sim: Simulator, t: TaskRun, d: Demand, view: BatchView) -> list[int]:
        cand = d.candidates(view)
        first = earliest_finish_node(sim, view, d, t)
        order = [first]
        free = np.where(cand, view.free[0] - d.cpu, -np.inf)
        for node in np.argsort(-free):
            if len(order) >= self.k or not np.isfinite(free[node]):
                break
            if int(node) not in order:
                order.append(int(node))
        return order

    def _search(
        self, sim: Simulator, t: TaskRun, d: Demand, view: BatchView, earlier: list[Decision]
    ) -> int:
        nodes = self._candidates(sim, t, d, view)
        if len(nodes) == 1:
            return nodes[0]
        visits = [0] * len(nodes)
        value = [0.0] * len(nodes)
        for i in range(self.budget):
            if i < len(nodes):
                j = i
            else:
                j = max(
                    range(len(nodes)),
                    key=lambda k: (
                        value[k] / visits[k] + self.c * math.sqrt(math.log(i) / visits[k])
                    ),
                )
            visits[j] += 1
            value[j] += self._rollout(
                sim, t, nodes[j], float(d.cpu[nodes[j]]), float(d.mem[nodes[j]]), earlier
            )
        best = max(range(len(nodes)), key=lambda k: value[k] / visits[k])
        return nodes[best]

    def _rollout(
        self, sim: Simulator, t: TaskRun, node: int, cpu: float, mem: float, earlier: list[Decision]
    ) -> float:
        clone, memo = sim.fork()
        for e in earlier:  # the batch's earlier decisions, then this one
            ct = memo[id(e.task)]
            assert isinstance(ct, TaskRun)
            clone.place(Decision(ct, e.node, e.cpu, e.mem, e.max_retries))
        ct = memo[id(t)]
        assert isinstance(ct, TaskRun)
        clone.place(Decision(ct, node, cpu, mem, DEFAULT_RETRIES))
        start = clone.metrics.total_reward
        # Tasks of this batch not decided yet stay unplaced in the clone: the same for
        # every candidate, so they do not bias the comparison.
        decided = 0
        # Bound simulated time too: tasks of this batch left unplaced in the clone keep their
        # workflows open, and with faults on the event queue never runs dry.
        limit = clone.now + self.horizon_s
        while decided < self.horizon:
            batch = clone.advance(until=limit)
            if batch is None:
                break
            clone.apply(self.rollout_policy.decide(clone, batch), batch)
            decided += len(batch)
        # unfinished work costs: the remaining reference time of workflows still in flight
        backlog = sum(run.remaining for run in clone.active.values())
        return (clone.metrics.total_reward - start) - 0.01 * backlog
