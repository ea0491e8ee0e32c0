"""The simulated cluster: node shapes, live per-node state as numpy arrays, and the zone network.

Per-node quantities that policies read in bulk (free cores, free memory, queue length, ...)
live in flat arrays indexed by node id, so a heuristic or the observation encoder scores every
node with a few vector operations whether the cluster has 8 nodes or 2,048. Queues and the
set of running tasks stay as Python containers on the side.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from dagsched.core.view import NODE_KINDS
from dagsched.core.workflow import TASK_TYPE_NAMES
from dagsched.sim.config import ClusterConfig

if TYPE_CHECKING:
    from dagsched.sim.runs import TaskRun

# Failure-rate memory: an exponentially weighted count of recent task failures per node.
FAILURE_HALF_LIFE_S = 1800.0
# Measured slowdown: each finished task moves its node's estimate this far towards the task's
# observed / advertised compute time (an exponentially weighted average; see Simulator._finish).
SLOWDOWN_WEIGHT = 0.3


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """Static description of one node."""

    id: int
    kind: str
    zone: int
    cores: float
    mem_gb: float
    gpu_mem_gb: float
    disk_gb: float
    net_gbps: float


class Network:
    """Zone-to-zone latency and bandwidth; a transfer costs latency + bytes / bandwidth."""

    def __init__(
        self,
        zone_of: list[int],
        node_gbps: list[float],
        cfg: ClusterConfig,
        rng: np.random.Generator,
    ) -> None:
        z = cfg.zones
        lat = rng.uniform(*cfg.inter_zone_latency_ms, size=(z, z)) / 1000.0
        gbps = rng.uniform(*cfg.inter_zone_gbps, size=(z, z))
        lat = np.triu(lat, 1) + np.triu(lat, 1).T
        gbps = np.triu(gbps, 1) + np.triu(gbps, 1).T
        np.fill_diagonal(lat, cfg.intra_zone_latency_ms / 1000.0)
        np.fill_diagonal(gbps, np.inf)  # within a zone the nodes' own NICs limit
        self.zone_of = zone_of
        self.node_gbps = node_gbps
        self.latency_s: list[list[float]] = lat.tolist()
        self.gbps: list[list[float]] = gbps.tolist()

    def transfer_s(self, src: int, dst: int, nbytes: float) -> float:
        """Seconds to move `nbytes` from node `src` to node `dst` (0 on the same node)."""
        if src == dst:
            return 0.0
        zs, zd = self.zone_of[src], self.zone_of[dst]
        bw = min(self.gbps[zs][zd], self.node_gbps[src], self.node_gbps[dst])
        return self.latency_s[zs][zd] + nbytes * 8.0 / (bw * 1e9)


class Cluster:
    """Static node info plus live state. The simulator is the only writer."""

    def __init__(
        self, cfg: ClusterConfig, rng: np.random.Generator, transient_failure: float = 0.0
    ) -> None:
        infos: list[NodeInfo] = []
        for g in cfg.groups:
            for _ in range(g.count):
                i = len(infos)
                infos.append(
                    NodeInfo(
                        i,
                        g.kind,
                        i % cfg.zones,
                        g.cores,
                        g.mem_gb,
                        g.gpu_mem_gb,
                        g.disk_gb,
                        g.net_gbps,
                    )
                )
        self.nodes = infos
        n = self.n = len(infos)
        self.kind_idx = np.array([NODE_KINDS.index(x.kind) for x in infos], dtype=np.int64)
        self.cores = np.array([x.cores for x in infos], dtype=float)
        self.mem_gb = np.array([x.mem_gb for x in infos], dtype=float)
        self.gpu_mem_gb = np.array([x.gpu_mem_gb for x in infos], dtype=float)
        self.net_gbps = np.array([x.net_gbps for x in infos], dtype=float)
        self.zone = np.array([x.zone for x in infos], dtype=np.int64)
        # speed[node, task_type]; a python copy for the per-task hot path
        self.speed = np.array(
            [[cfg.speed[x.kind][t] for t in TASK_TYPE_NAMES] for x in infos], dtype=float
        )
        self.speed_rows: list[list[float]] = self.speed.tolist()
        self.inv_cores = 1.0 / self.cores
        self.inv_mem = 1.0 / self.mem_gb
        self.shape = np.stack((self.cores, self.mem_gb))  # [2, n], for batched scoring
        self.inv_shape = 1.0 / self.shape
        self.cores_list: list[float] = self.cores.tolist()
        self.mem_list: list[float] = self.mem_gb.tolist()
        # per-node transient task-failure probability, jittered around the configured mean
        self.transient_failure: list[float] = (
            (transient_failure * rng.uniform(0.5, 1.5, size=n)).clip(0, 0.99).tolist()
        )
        # hidden slowdown per node (a drift): actual run time = advertised time x slowdown
        self.slowdown: list[float] = [1.0] * n
        # what can be measured of it: observed / advertised compute time of recent tasks, as a
        # node agent comparing run times with their estimates would report it
        self.observed_slowdown: list[float] = [1.0] * n
        self.network = Network([x.zone for x in infos], self.net_gbps.tolist(), cfg, rng)

        # Live state as plain lists indexed by node id: the simulator updates single entries
        # on every event, which Python lists do several times faster than numpy arrays.
        # Policies copy them into numpy once per batch.
        self.alive: list[bool] = [True] * n
        self.n_alive = n
        self.free_cores: list[float] = self.cores.tolist()
        self.free_mem: list[float] = self.mem_gb.tolist()
        self.queue_len: list[int] = [0] * n
        self.queued_core_s: list[float] = [0.0] * n  # estimated work waiting in each queue
        # per node, a heap of (arrival time, bytes) of inputs still on the wire
        self.inbound: list[list[tuple[float, float]]] = [[] for _ in range(n)]
        self.failures: list[float] = [0.0] * n  # decayed count of recent task failures
        self.failures_at: list[float] = [0.0] * n  # time `failures` was last decayed to
        # per node, the attempts waiting for room: by priority (higher first), then in the
        # order they were queued (`queue_key`)
        self.queues: list[list[TaskRun]] = [[] for _ in range(n)]
        self.running: list[set[TaskRun]] = [set() for _ in range(n)]
        # running sums of reserved-cpu fractions for O(1) Jain fairness
        self._sum_x = 0.0
        self._sum_x2 = 0.0

    def receive(self, node: int, now: float, until: float, nbytes: float) -> None:
        """`nbytes` start arriving at `node` now and are all there at time `until`."""
        h = self.inbound[node]
        while h and h[0][0] <= now:  # keep the heap to what is still in flight
            heapq.heappop(h)
        heapq.heappush(h, (until, nbytes))

    def net_in_bytes(self, node: int, now: float) -> float:
        """Bytes on the wire towards `node` at time `now` (finished transfers dropped)."""
        h = self.inbound[node]
        while h and h[0][0] <= now:
            heapq.heappop(h)
        return sum(b for _, b in h)

    def set_alive(self, node: int, alive: bool) -> None:
        """Mark a node up or down."""
        if self.alive[node] != alive:
            self.alive[node] = alive
            self.n_alive += 1 if alive else -1

    # -- reservations -------------------------------------------------------------------------

    def reserve(self, node: int, cores: float, mem: float) -> None:
        """Take `cores` and `mem` GB on `node` (the caller checked that they fit)."""
        self._track_fraction(node, -cores)
        self.free_cores[node] -= cores
        self.free_mem[node] -= mem

    def release(self, node: int, cores: float, mem: float) -> None:
        """Give back a reservation."""
        self._track_fraction(node, cores)
        self.free_cores[node] += cores
        self.free_mem[node] += mem

    def fits(self, node: int, cores: float, mem: float) -> bool:
        """Whether a reservation fits in what `node` has free now (with float slack)."""
        return self.free_cores[node] + 1e-9 >= cores and self.free_mem[node] + 1e-9 >= mem

    def _track_fraction(self, node: int, delta_free: float) -> None:
        c = self.cores_list[node]
        old = 1.0 - self.free_cores[node] / c
        new = old - delta_free / c
        self._sum_x += new - old
        self._sum_x2 += new * new - old * old

    # -- failure memory ----------------------------------------------------------------------

    def record_failure(self, node: int, now: float) -> None:
        """Count one task failure on `node` in its decayed failure memory."""
        self.failure_rate(node, now)
        self.failures[node] += 1.0

    def failure_rate(self, node: int, now: float) -> float:
        """Recent failures on `node`, decayed with a half-life of FAILURE_HALF_LIFE_S."""
        dt = now - self.failures_at[node]
        if dt > 0:
            self.failures[node] *= 0.5 ** (dt / FAILURE_HALF_LIFE_S)
            self.failures_at[node] = now
        return self.failures[node]

    def total_cores(self) -> float:
        return float(self.cores.sum())
