"""Wire messages <-> simulator types; the code lives in `dagsched.sim.wire` (the learner
uses it too, and nothing may import the daemon)."""

from dagsched.sim.wire import to_message, to_workflow

__all__ = ["to_message", "to_workflow"]
