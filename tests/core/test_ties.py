"""Ties between nodes go to the first, on the served numpy path and in torch alike."""

from __future__ import annotations

import numpy as np
import torch

from dagsched.core.ties import TIE_TOL, best_node
from dagsched.policy.model import N_CONT, PolicyOutput, act


def test_a_tie_in_the_last_float_bit_goes_to_the_first_node_on_both_paths() -> None:
    # nodes 1 and 2 are in the same state; node 2's logit came out one float32 step higher
    top = np.float32(3.0)
    logits = np.array([1.0, top, np.nextafter(top, np.float32(4.0)), 2.0], dtype=np.float32)
    assert int(np.argmax(logits)) == 2  # a plain argmax follows the rounding
    assert best_node(logits) == 1
    conc = torch.full((1, 4, N_CONT, 2), 5.0)
    out = PolicyOutput(
        torch.from_numpy(logits)[None], conc, torch.zeros(1), torch.zeros(1, 4, N_CONT)
    )
    node, _, _ = act(out, True)
    assert int(node) == 1
    # a real difference is not a tie
    clear = logits.copy()
    clear[2] = top + 10 * TIE_TOL
    assert best_node(clear) == 2
    out = PolicyOutput(
        torch.from_numpy(clear)[None], conc, torch.zeros(1), torch.zeros(1, 4, N_CONT)
    )
    assert int(act(out, True)[0]) == 2
