"""The A/B split: a `challenger_share` slice of workflows, stable by workflow id, goes to the
challenger, the next `explore_share` slice to the exploration arm, the next `holdback_share`
slice to the held-back old champion; every decision names the arm and the registry version
that served that arm."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path

from dagsched.daemon.arms import workflow_bucket
from dagsched.daemon.broker import ensure_topics
from dagsched.registry.store import CHALLENGER, HOLDBACK, Registry
from tests.conftest import clone_mlflow_home
from tests.daemon.conftest import Client, make_settings, register_version


async def test_challenger_gets_a_stable_share_of_workflows(
    broker, redis_url, tmp_path: Path, start_daemon, champion_template: Path
):
    share, explore, holdback = 0.3, 0.2, 0.2
    s = make_settings(
        broker.bootstrap,
        redis_url,
        tmp_path,
        **{
            "daemon.challenger_share": share,
            "daemon.explore_share": explore,
            "daemon.holdback_share": holdback,
        },
    )
    await ensure_topics(s)
    clone_mlflow_home(champion_template, s.home)
    reg = Registry(s)
    v2 = await asyncio.to_thread(register_version, reg, "the challenger")
    await asyncio.to_thread(reg.set_alias, CHALLENGER, v2)
    v3 = await asyncio.to_thread(register_version, reg, "a held-back champion")
    await asyncio.to_thread(reg.set_alias, HOLDBACK, v3)
    # the exploration slice is served by the challenger, sampling
    served = {"champion": "v1", "challenger": f"v{v2}", "explore": f"v{v2}", "holdback": f"v{v3}"}

    client = await Client(s).start()
    try:
        await client.heartbeats(4)
        d = await start_daemon(s, registry=True)
        await d.until_serving("champion", served["champion"])
        await d.until_serving("challenger", served["challenger"])
        await d.until_serving("holdback", served["holdback"])
        n_wf, n_tasks = 40, 3
        for i in range(n_wf):
            await client.workflow(f"wf-{i}", n_tasks=n_tasks)
            for t in range(n_tasks):
                await client.ready(f"wf-{i}", t)
        await client.ready("wf-0", 0, attempt=1)  # a retry stays on the workflow's arm
        decisions = await client.wait("decisions", n_wf * n_tasks + 1, timeout=60)
        m = await d.metrics()
    finally:
        await client.close()
    arms: dict[str, set[str]] = defaultdict(set)
    for x in decisions:
        arms[x.workflow_id].add(x.arm)
        assert x.model_version == served[x.arm]
    assert all(len(a) == 1 for a in arms.values())  # stable per workflow
    expected = {f"wf-{i}" for i in range(n_wf) if workflow_bucket(f"wf-{i}") < share}
    got = {wf for wf, a in arms.items() if a == {"challenger"}}
    assert got == expected
    assert 0.1 < len(got) / n_wf < 0.5
    explored = {wf for wf, a in arms.items() if a == {"explore"}}
    assert explored == {
        f"wf-{i}" for i in range(n_wf) if share <= workflow_bucket(f"wf-{i}") < share + explore
    }
    assert explored
    held = {wf for wf, a in arms.items() if a == {"holdback"}}
    low = share + explore
    assert held == {
        f"wf-{i}" for i in range(n_wf) if low <= workflow_bucket(f"wf-{i}") < low + holdback
    }
    assert held
    by_arm = {arm: sum(x.arm == arm for x in decisions) for arm in served}
    for arm, n in by_arm.items():
        assert m.value("dagsched_decisions_total", arm=arm) == n
    assert m.value("dagsched_decisions_total", arm="fallback") == 0
