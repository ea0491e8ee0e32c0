"""Hot reload between batches: a Redis notice (or the poll) swaps the model; a refused version
keeps the current one serving; every decision names the version that made it."""

from __future__ import annotations

from dagsched.policy.heuristic import LeastLoadedScheduler
from dagsched.registry.errors import RegistryError
from dagsched.registry.serving import model_channel
from tests.daemon.conftest import Client, wait_for


class Named(LeastLoadedScheduler):
    def __init__(self, version: str) -> None:
        self.version = version


async def test_notice_swaps_champion_and_refuses_a_bad_version(
    settings, client: Client, start_daemon, redis
):
    registry = {"champion": None}

    def version_of(_s, arm):
        return registry["champion"] if arm == "champion" else None

    def loader(_s, arm):
        v = registry["champion"]
        if v == "v3":
            raise RegistryError("v3: checksum mismatch")
        return (v, Named(f"gnn:{v}")) if v else None

    await client.heartbeats(2)
    d = await start_daemon(registry=True, loader=loader, version_of=version_of)
    await client.workflow("wf-0", n_tasks=4)
    await client.ready("wf-0", 0)
    first = (await client.wait("decisions", 1))[0]
    assert (first.arm, first.model_version) == ("fallback", "heuristic:least_loaded")

    registry["champion"] = "v2"
    await redis.publish(model_channel(settings), "champion v2")
    await wait_for(
        lambda: d.daemon.models.version("champion") == "v2" or d.daemon.models._pending,
        10,
        "the load",
    )
    await client.ready("wf-0", 1)
    second = (await client.wait("decisions", 2))[1]
    assert (second.arm, second.model_version) == ("champion", "gnn:v2")

    registry["champion"] = "v3"  # fails its checks: refused, v2 keeps serving
    await redis.publish(model_channel(settings), "champion v3")
    await wait_for(lambda: d.daemon.models._refused.get("champion") == "v3", 10, "the refusal")
    await client.ready("wf-0", 2)
    third = (await client.wait("decisions", 3))[2]
    assert (third.arm, third.model_version) == ("champion", "gnn:v2")
    assert d.daemon.metrics.model_refused._value.get() == 1
