"""Estimates every scheduler may make from what a deployment knows: zones and NICs for
transfers, declared (or history-predicted) runtimes for when running tasks end.

Never the simulator's hidden latency matrix or true run times: heuristics, the observation
and the daemon all estimate with these same rules.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CROSS_ZONE_LATENCY_S = 0.05
SAME_ZONE_LATENCY_S = 0.001
CROSS_ZONE_GBPS = 5.0


def transfer_to_all_s(
    zone: np.ndarray, net_gbps: np.ndarray, src: int, nbytes: float
) -> np.ndarray:
    """Estimated seconds to move `nbytes` from node `src` to every node (0 to itself): the
    NICs bound a transfer within a zone, CROSS_ZONE_GBPS one across zones."""
    t = _seconds(zone == zone[src], net_gbps[src], net_gbps, nbytes)
    t[src] = 0.0
    return t


def transfers_s(
    zone: np.ndarray, net_gbps: np.ndarray, src: np.ndarray, nbytes: np.ndarray
) -> np.ndarray:
    """`transfer_to_all_s` for many (`src`, `nbytes`) pairs at once: [P, n]."""
    same_zone = zone[None, :] == zone[src][:, None]
    t = _seconds(same_zone, net_gbps[src][:, None], net_gbps[None, :], nbytes[:, None])
    t[np.arange(len(src)), src] = 0.0
    return t


def _seconds(same_zone: Any, src_gbps: Any, net_gbps: Any, nbytes: Any) -> np.ndarray:
    """The transfer time to each destination, broadcast over whatever shapes are given (one
    source, or a column of them): the one formula both callers share."""
    gbps = np.where(
        same_zone, np.minimum(net_gbps, src_gbps), np.minimum(CROSS_ZONE_GBPS, net_gbps)
    )
    return nbytes * 8.0 / (gbps * 1e9) + np.where(
        same_zone, SAME_ZONE_LATENCY_S, CROSS_ZONE_LATENCY_S
    )


def advertised_run_s(duration_s: float, speed: float, cpu_cores: float, res_cores: float) -> float:
    """What a node expects a task to compute from its declaration: the declared duration at
    the node's advertised `speed`, proportionally longer when reserved below its declared
    CPU."""
    throttle = cpu_cores / res_cores
    advertised = duration_s / speed
    return advertised * throttle if throttle > 1 else advertised


def raised_prediction_s(predicted_s: float, elapsed_s: float, declared_s: float) -> float:
    """A running task's predicted run time once it has run `elapsed_s` (Tsafrir, Etsion and
    Feitelson, 2007): the prediction while it holds; once outlived, the declared estimate
    if that is longer still, else twice the time elapsed."""
    if elapsed_s < predicted_s:
        return predicted_s
    return declared_s if declared_s > elapsed_s else 2.0 * elapsed_s


def raised_predictions_s(
    predicted_s: np.ndarray, elapsed_s: np.ndarray, declared_s: np.ndarray
) -> np.ndarray:
    """`raised_prediction_s` of many running tasks at once (the same numbers, elementwise)."""
    outlived = np.where(declared_s > elapsed_s, declared_s, 2.0 * elapsed_s)
    return np.where(elapsed_s < predicted_s, predicted_s, outlived)
