"""The A/B split: which workflows a challenger serves, stable by workflow id.

Part of the contract between the daemon (which routes) and whatever replays or judges the
split (the simulated loop, tests): every task and retry of a workflow goes to one arm.
"""

from __future__ import annotations

import zlib


def workflow_bucket(workflow_id: str) -> float:
    """A stable number in [0, 1) per workflow id; the challenger serves those below its share."""
    return zlib.crc32(workflow_id.encode()) / 2**32
