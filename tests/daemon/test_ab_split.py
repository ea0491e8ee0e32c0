"""The A/B split: a `challenger_share` slice of workflows, stable by workflow id, goes to the
challenger; every decision names the arm and a version that served that arm."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from dagsched.daemon.broker import ensure_topics
from dagsched.daemon.models import workflow_bucket
from dagsched.policy.heuristic import LeastLoadedScheduler
from tests.daemon.conftest import Client, make_settings


class Named(LeastLoadedScheduler):
    def __init__(self, version: str) -> None:
        self.version = version


async def test_challenger_gets_a_stable_share_of_workflows(
    broker, redis_url, tmp_path: Path, start_daemon
):
    share = 0.3
    s = make_settings(broker.bootstrap, redis_url, tmp_path, **{"daemon.challenger_share": share})
    await ensure_topics(s)
    served = {"champion": "v1", "challenger": "v2"}

    def version_of(_s, arm):
        return served[arm]

    def loader(_s, arm):
        return served[arm], Named(f"gnn:{served[arm]}")

    client = await Client(s).start()
    try:
        await client.heartbeats(4)
        await start_daemon(s, registry=True, loader=loader, version_of=version_of)
        n_wf, n_tasks = 40, 3
        for i in range(n_wf):
            await client.workflow(f"wf-{i}", n_tasks=n_tasks)
            for t in range(n_tasks):
                await client.ready(f"wf-{i}", t)
        await client.ready("wf-0", 0, attempt=1)  # a retry stays on the workflow's arm
        decisions = await client.wait("decisions", n_wf * n_tasks + 1, timeout=60)
    finally:
        await client.close()
    arms: dict[str, set[str]] = defaultdict(set)
    for d in decisions:
        arms[d.workflow_id].add(d.arm)
        assert d.model_version == f"gnn:{served[d.arm]}"
    assert all(len(a) == 1 for a in arms.values())  # stable per workflow
    expected = {f"wf-{i}" for i in range(n_wf) if workflow_bucket(f"wf-{i}") < share}
    got = {wf for wf, a in arms.items() if a == {"challenger"}}
    assert got == expected
    assert 0.1 < len(got) / n_wf < 0.5
