"""The kinds of event on the simulator's heap (`Simulator._push`, `Simulator._handle`).

Here, not in the engine, so that the modules the engine is built from (`sim.faults`) can push
events too.
"""

ARRIVAL, FINISH, FAIL, NODE_DOWN, NODE_UP, DRIFT, SHIFT = range(7)
