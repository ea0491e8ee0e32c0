"""Which node a served decision takes among equal logits: the lowest index within `TIE_TOL`
of the best.

Nodes in the same state get the same logit, but the served path (numpy, rows recomputed one
by one as placements change them) and the plain forward pass (torch, all rows at once) may
differ in the last float bit, and a plain argmax then breaks the tie differently on the two
paths. Within `TIE_TOL` the first node wins on both (`ActorCritic.act` does the same in
torch), so the decision log replays to the same node.
"""

from __future__ import annotations

import numpy as np

TIE_TOL = 1e-5  # logits within this of the best are a tie


def best_node(logits: np.ndarray, top: float | None = None) -> int:
    """The lowest index whose logit is within `TIE_TOL` of the largest (`top`, when the
    caller has it)."""
    z = np.asarray(logits)
    return int(np.flatnonzero(z >= (z.max() if top is None else top) - TIE_TOL)[0])
