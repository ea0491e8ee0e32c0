"""What the cluster holds and really uses, over time: node telemetry and the utilisation
metrics (`reserved_util`, `used_util` and their CPU / memory splits).

The simulator counts each attempt in when it starts and out when it ends (`hold`). Per node
it keeps the cores and memory really in use (what a node agent reports) and its dominant
shares; cluster-wide it integrates reserved and used amounts over the busy window: from the
first workflow that leaves the system (finished or failed) to the last arrival. That is the
steady state `load` describes: without the ramp-up from an empty cluster before work flows
through it (a few hundred seconds on the default scenario, 5-11% of the arrivals' span), and
without the drain after the last arrival. A run where no workflow leaves before the last
arrival is measured from its first arrival. Memory use counts at its mean over an attempt,
half its peak, since it grows linearly with progress.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagsched.sim.cluster import Cluster


class UsageMeter:
    """Reservations and real use per node and cluster-wide, integrated over a time window."""

    def __init__(self, cluster: Cluster) -> None:
        n = cluster.n
        self.cluster = cluster
        self.node_use = [[0.0, 0.0] for _ in range(n)]  # cores and GB really in use
        self._total = [0.0, 0.0, 0.0, 0.0]  # reserved cores, reserved GB, used cores, used GB
        self._dom = [[0.0, 0.0] for _ in range(n)]  # per node: reserved, used dominant share
        self._dom_at = [0.0] * n
        self.window = [0.0, 0.0, 0.0, 0.0]  # _total x seconds within the window
        self.node_dominant_s = [0.0, 0.0]  # dominant shares x seconds, summed over nodes
        self.start_s = self.end_s = 0.0
        self.open = False
        self.warm_at: float | None = None  # when the first workflow left the system
        self._at_warm = ([0.0] * 4, [0.0, 0.0])  # the integrals then

    @property
    def warm(self) -> bool:
        return self.warm_at is not None

    def start(self, now: float) -> None:
        """The window opens (the first arrival)."""
        self.start_s = self.end_s = now
        self._dom_at = [now] * self.cluster.n
        self.open = True

    def mark_warm(self, now: float) -> None:
        """The first workflow left the system: the busy window starts here (the integrals so
        far are kept, to be subtracted)."""
        if self.open and self.warm_at is None:
            self._integrate(now)
            for node in range(self.cluster.n):
                self._integrate_node(node, now)
            self.warm_at = now
            self._at_warm = (list(self.window), list(self.node_dominant_s))

    def stop(self, now: float) -> None:
        """The window closes (the last arrival)."""
        if self.open:
            self._integrate(now)
            for node in range(self.cluster.n):
                self._integrate_node(node, now)
            self.open = False

    def _integrate(self, now: float) -> None:
        dt = now - self.end_s
        if dt > 0:
            w, total = self.window, self._total
            for k in range(4):
                w[k] += total[k] * dt
            self.end_s = now

    def _integrate_node(self, node: int, now: float) -> None:
        dt = now - self._dom_at[node]
        if dt > 0:
            dom, acc = self._dom[node], self.node_dominant_s
            acc[0] += dom[0] * dt
            acc[1] += dom[1] * dt
        self._dom_at[node] = now

    def hold(
        self, node: int, res_cores: float, res_mem: float, use_cores: float, use_mem: float,
        sign: float, now: float,
    ) -> None:  # fmt: skip
        """Count an attempt's reservation and real use in (sign 1) or out (sign -1), after
        the cluster's own reservation changed."""
        if self.open:
            self._integrate(now)
            self._integrate_node(node, now)
        total, c = self._total, self.cluster
        total[0] += sign * res_cores
        total[1] += sign * res_mem
        total[2] += sign * use_cores
        total[3] += sign * use_mem
        used = self.node_use[node]
        used[0] += sign * use_cores
        used[1] += sign * use_mem
        cores, mem = c.cores_list[node], c.mem_list[node]
        res_c, res_m = 1.0 - c.free_cores[node] / cores, 1.0 - c.free_mem[node] / mem
        use_c, use_m = used[0] / cores, used[1] / mem
        dom = self._dom[node]
        dom[0] = res_c if res_c > res_m else res_m
        dom[1] = use_c if use_c > use_m else use_m

    def shares(self) -> dict[str, float]:
        """The time-averaged utilisation metrics over the busy window (from the first arrival
        when no workflow left before the window closed; zeros on a run with no time in it)."""
        start, w, dom = self.start_s, self.window, self.node_dominant_s
        if self.warm_at is not None and self.warm_at < self.end_s:
            start = self.warm_at
            w = [a - b for a, b in zip(w, self._at_warm[0], strict=True)]
            dom = [a - b for a, b in zip(dom, self._at_warm[1], strict=True)]
        span = self.end_s - start
        span = span if span > 0 else 1.0
        cores, mem = float(self.cluster.cores.sum()), float(self.cluster.mem_gb.sum())
        n = self.cluster.n
        return {
            "reserved_util": dom[0] / (n * span),
            "used_util": dom[1] / (n * span),
            "reserved_cpu_util": w[0] / (cores * span),
            "reserved_mem_util": w[1] / (mem * span),
            "used_cpu_util": w[2] / (cores * span),
            "used_mem_util": w[3] / (mem * span),
        }
