"""`dagsched topics tail | list` as an operator runs them: a real process against the embedded
broker, with a real daemon committing offsets."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient

from dagsched.daemon.broker import free_port
from dagsched.schemas.messages import TaskReadyMsg
from dagsched.settings import Settings
from tests.daemon.conftest import Client, committed, wait_for

REPO = Path(__file__).resolve().parents[2]


class Proc:
    """A `dagsched` process started with the test's broker and topic prefix."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.stderr: list[str] = []

    async def stderr_until(self, event: str, timeout: float = 30.0) -> None:
        """Read stderr lines until a log line with `event` (the command is ready)."""
        stream = self.proc.stderr
        assert stream is not None

        async def scan() -> None:
            while True:
                line = await stream.readline()
                assert line, f"exited before {event}: {''.join(self.stderr)}"
                self.stderr.append(line.decode())
                if event in self.stderr[-1]:
                    return

        await asyncio.wait_for(scan(), timeout)

    async def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        out, err = await asyncio.wait_for(self.proc.communicate(), timeout)
        assert self.proc.returncode is not None
        return self.proc.returncode, out.decode(), "".join(self.stderr) + err.decode()


async def start(settings: Settings, *args: str, bootstrap: str | None = None) -> Proc:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    env.update(
        PYTHONPATH=str(REPO),
        DAGSCHED_KAFKA_BOOTSTRAP=bootstrap or settings.kafka_bootstrap,
        DAGSCHED_TOPIC_PREFIX=settings.topic_prefix,
        DAGSCHED_HOME=str(settings.home),
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "dagsched.cli.main",
        "--profile",
        "test",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    return Proc(proc)


async def dagsched(settings: Settings, *args: str, **kw: Any) -> tuple[int, str, str]:
    return await (await start(settings, *args, **kw)).finish()


def one_line_error(rc: int, out: str, err: str, *fragments: str) -> None:
    assert rc == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for fragment in fragments:
        assert fragment in lines[0]


def ready(wf: str, task: int) -> bytes:
    return TaskReadyMsg(workflow_id=wf, task=task).encode()


async def test_tail_from_the_beginning_decodes_and_reports_bad_records(
    settings: Settings, client: Client
) -> None:
    await client.send("tasks", ready("wf-a", 0), "wf-a")
    await client.send("tasks", b"{not json", "wf-a")  # same key: same partition, in order
    await client.send("tasks", ready("wf-a", 1), "wf-a")

    rc, out, err = await dagsched(
        settings, "topics", "tail", "tasks", "--from-beginning", "-n", "3"
    )
    assert rc == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert len(lines) == 3
    assert [r["offset"] for r in lines] == [0, 1, 2]
    assert {r["topic"] for r in lines} == {settings.topic("tasks")}
    assert {r["key"] for r in lines} == {"wf-a"}
    assert lines[0]["value"] == {
        "schema_version": 1,
        "type": "task_ready",
        "workflow_id": "wf-a",
        "task": 0,
        "attempt": 0,
        "at": None,
    }
    assert "value" not in lines[1]
    assert lines[1]["raw"] == "{not json"
    assert lines[1]["error"].startswith("invalid JSON")
    assert lines[2]["value"]["task"] == 1

    # the configured name and the full name reach the same topic; --timeout ends a short read
    for name in ("dagsched.tasks", settings.topic("tasks")):
        rc, out, err = await dagsched(
            settings, "topics", "tail", name, "--from-beginning", "-n", "1", "--timeout", "30"
        )
        assert rc == 0, err
        assert json.loads(out)["offset"] == 0


async def test_tail_without_from_beginning_follows_only_new_records(
    settings: Settings, client: Client
) -> None:
    await client.send("tasks", ready("old", 0), "old")
    proc = await start(
        settings, "--log-level", "INFO", "topics", "tail", "tasks", "-n", "2", "--timeout", "60"
    )
    await proc.stderr_until("topics.tail.following")
    for task in range(3):  # the third is past -n 2 and must not be printed
        await client.send("tasks", ready("new", task), "new")
    rc, out, err = await proc.finish()
    assert rc == 0, err
    got = [json.loads(line)["value"] for line in out.splitlines()]
    assert [(v["workflow_id"], v["task"]) for v in got] == [("new", 0), ("new", 1)]

    # nothing new arrives: --timeout stops the follow with no output
    rc, out, err = await dagsched(settings, "topics", "tail", "decisions", "--timeout", "0.5")
    assert (rc, out) == (0, ""), err


async def test_list_shows_end_offsets_and_each_groups_commits_and_lag(
    settings: Settings, client: Client, start_daemon: Any
) -> None:
    await client.heartbeats(2)
    d = await start_daemon()
    for w in range(3):
        await client.workflow(f"wf-{w}", n_tasks=2)
        await client.ready(f"wf-{w}", 0)
    await client.wait("decisions", 3)

    async def all_six() -> bool:
        return await committed(settings) == 6

    await wait_for(all_six, what="the daemon to commit its 6 inputs")
    await d.stop()
    await client.send("tasks", ready("wf-0", 1), "wf-0")  # nobody reads it: lag 1

    rc, out, err = await dagsched(settings, "topics", "list", "--json")
    assert rc == 0, err
    doc = json.loads(out)
    rows = {r["short_name"]: r for r in doc["topics"]}
    assert list(rows) == ["tasks", "decisions", "events", "deadletter", "decisionlog"]
    tasks = rows["tasks"]
    assert tasks["topic"] == settings.topic("tasks")
    assert tasks["partitions"] == settings.topics.partitions == len(tasks["end_offsets"])
    assert tasks["end_total"] == 7
    daemon_group = settings.topic_prefix + settings.daemon.group_id
    (g,) = [g for g in tasks["groups"] if g["group"] == daemon_group]
    assert sum(o for o in g["committed"] if o is not None) == 6
    assert g["lag_total"] == 1 and sum(g["lag"]) == 1
    assert rows["decisions"]["end_total"] == 3 and rows["decisions"]["groups"] == []
    assert rows["deadletter"]["end_total"] == 0
    # the updater's group has read the two heartbeats
    (events_group,) = rows["events"]["groups"]
    assert events_group["group"].startswith(daemon_group) and events_group["lag_total"] == 0

    # the table says the same for people; one short name picks one topic
    rc, out, err = await dagsched(settings, "topics", "list", "tasks")
    assert rc == 0, err
    row = next(line for line in out.splitlines() if settings.topic("tasks") in line)
    assert daemon_group in row
    assert [c.strip() for c in row.strip("│ \n").split("│")][1:] == [
        str(settings.topics.partitions),
        "7",
        daemon_group,
        "6",
        "1",
    ]
    assert settings.topic("decisions") not in out


async def test_unknown_topic_and_unreachable_broker_are_one_line_errors(
    settings: Settings,
) -> None:
    rc, out, err = await dagsched(settings, "topics", "tail", "taks", "-n", "1")
    one_line_error(rc, out, err, "unknown topic 'taks'", "tasks, decisions")
    rc, out, err = await dagsched(settings, "topics", "list", "taks")
    one_line_error(rc, out, err, "unknown topic 'taks'")
    # asking did not create it (a broker with auto-creation would, had we named it)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap)
    await admin.start()
    try:
        names = set(await admin.list_topics())
    finally:
        await admin.close()
    assert not {"taks", settings.topic_prefix + "taks"} & names

    nowhere = f"127.0.0.1:{free_port()}"
    for args in (("topics", "tail", "tasks", "-n", "1"), ("topics", "list")):
        rc, out, err = await dagsched(settings, *args, bootstrap=nowhere)
        one_line_error(rc, out, err, f"broker {nowhere} unreachable")
