"""Decided and finished workflows published to the learner's topics, as the daemon and the
job queue would: what the learner tests train on."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from dagsched.core.observation import observation_to_dict
from dagsched.schemas.messages import (
    DecisionLogMsg,
    DecisionMsg,
    TaskFinishedMsg,
    TaskSpecMsg,
    TaskStartedMsg,
    WorkflowMsg,
)
from dagsched.settings import Settings
from tests.daemon.conftest import Client

Demos = tuple[list[Any], list[int], list[Any]]  # observations, node indices, unit actions


async def publish_decided(
    s: Settings, demos: Demos, version: str, first: int = 0, n_wf: int = 10
) -> None:
    """`n_wf` workflows of 5 tasks, each decided (decision + decision log) by `version` and
    finished: 5 x `n_wf` trainable transitions for the learner."""
    obs, nodes, units = demos
    rng = np.random.default_rng(first)
    client = await Client(s).start()
    try:
        spec = TaskSpecMsg(name="t", type="cpu", duration_s=10, cpu_cores=2, mem_gb=4)
        for w in range(first, first + n_wf):
            wf = f"wf-{w}"
            msg = WorkflowMsg(workflow_id=wf, tasks=[spec] * 5, edges=[], deadline_s=30)
            await client.send("tasks", msg.encode(), wf)
            for t in range(5):
                i = (w * 5 + t) % len(obs)
                common = {"workflow_id": wf, "task": t, "attempt": 0}
                dec = DecisionMsg(
                    **common, node="node-0000", cpu=0.2, mem=0.3, max_retries=3,
                    model_version=f"v{version}", arm="champion", log_prob=-1.0,
                    decided_at=time.time(), latency_ms=1.0,
                )  # fmt: skip
                log = DecisionLogMsg(
                    **common, model_version=f"v{version}", arm="champion",
                    node_index=nodes[i], unit=list(units[i]), log_prob=-1.0, value=0.0,
                    decided_at=time.time(), observation=observation_to_dict(obs[i]),
                )  # fmt: skip
                await client.send("decisions", dec.encode(), wf)
                await client.send("decisionlog", log.encode(), wf)
                started = TaskStartedMsg(**common, node="node-0000", at=0.0)
                await client.send("events", started.encode(), "node-0000")
                done = TaskFinishedMsg(**common, node="node-0000", at=float(rng.uniform(5, 60)))
                await client.send("events", done.encode(), "node-0000")
    finally:
        await client.close()
