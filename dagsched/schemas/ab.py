"""The A/B split: which arm serves each workflow, stable by workflow id.

Part of the contract between the daemon (which routes) and whatever replays or judges the
split (the simulated loop, tests): every task and retry of a workflow goes to one arm.
"""

from __future__ import annotations

import zlib


def workflow_bucket(workflow_id: str) -> float:
    """A stable number in [0, 1) per workflow id; the challenger serves those below its share."""
    return zlib.crc32(workflow_id.encode()) / 2**32


def slice_arm(
    bucket: float,
    challenger_share: float,
    explore_share: float,
    holdback_share: float,
    challenger: bool,
    holdback: bool,
) -> str:
    """The arm of a workflow in `bucket`: the buckets from 0 are the challenger's slice
    (while one serves), then the exploration slice ("explore"), then the holdback slice
    (while an old champion is held back); every other workflow is the champion's."""
    if challenger and bucket < challenger_share:
        return "challenger"
    held = challenger_share + explore_share  # where the holdback slice starts
    if challenger_share <= bucket < held:
        return "explore"
    if holdback and held <= bucket < held + holdback_share:
        return "holdback"
    return "champion"
