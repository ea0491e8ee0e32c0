"""`dagsched topics list | tail`: what operators look at on the broker.

`list` shows each topic's partitions and end offsets, and per consumer group its committed
offsets and lag. `tail` prints records decoded with the wire schema, one JSON object per line;
a record that does not decode is printed with an `error` field instead of a `value`.

Topics may be named as the project does ("tasks", "decisions", ...: the configured name with
`topic_prefix`), by their configured name ("dagsched.tasks", prefix added), or in full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import structlog
import typer

from dagsched.cli.context import help_without_command
from dagsched.cli.service_cmds import BOOTSTRAP, service_settings
from dagsched.schemas.topics import TOPICS
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

topics_app = typer.Typer(help="Inspect dagsched topics on the broker.")

CONNECT_TIMEOUT_S = 15.0
T = TypeVar("T")


class TopicsError(Exception):
    """A problem the user can fix (unknown topic, unreachable broker): one line, exit 2."""


@topics_app.callback(invoke_without_command=True)
def _topics(ctx: typer.Context) -> None:
    """Inspect dagsched topics on the broker."""
    help_without_command(ctx)


def resolve(settings: Settings, name: str, existing: set[str]) -> str:
    """The broker's name for `name`: a short name ("tasks"), a configured name
    ("dagsched.tasks", prefixed), or a full name that exists."""
    candidates = []
    if name in TOPICS:
        candidates.append(settings.topic(name))
    candidates += [settings.topic_prefix + name, name]
    for full in candidates:
        if full in existing:
            return full
    raise TopicsError(
        f"unknown topic {name!r} on {settings.kafka_bootstrap} (short names: "
        f"{', '.join(TOPICS)}; topic_prefix {settings.topic_prefix!r})"
    )


def _run(settings: Settings, main: Callable[[asyncio.Event], Awaitable[T]]) -> T:
    """Run `main(stop)`; Ctrl-C or SIGTERM sets `stop`; Kafka failures become TopicsError."""
    from aiokafka.errors import KafkaError

    async def runner() -> T:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    # aiokafka logs each failed connection at ERROR; the one-line error below says it instead
    kafka_log = logging.getLogger("aiokafka")
    level = kafka_log.level
    kafka_log.setLevel(logging.CRITICAL)
    try:
        return asyncio.run(runner())
    except (KafkaError, TimeoutError) as exc:
        raise TopicsError(
            f"broker {settings.kafka_bootstrap} unreachable ({type(exc).__name__})"
        ) from None
    finally:
        kafka_log.setLevel(level)


def _admin(settings: Settings) -> Any:
    from aiokafka.admin import AIOKafkaAdminClient

    return AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap,
        request_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
    )


async def partitions(admin: Any) -> dict[str, list[int]]:
    """Every topic on the broker and its partition ids.

    Metadata is asked for all topics at once: asking for one by name would make a broker
    with auto-creation (Tansu, Kafka's default) create a mistyped topic.
    """
    await asyncio.wait_for(admin.start(), CONNECT_TIMEOUT_S)
    return {
        t["topic"]: sorted(p["partition"] for p in t["partitions"])
        for t in await admin.describe_topics()
        if t["error_code"] == 0 and not t["is_internal"]
    }


async def _consumer(settings: Settings) -> Any:
    """A started consumer outside any group (it commits nothing)."""
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=settings.daemon.fetch_max_wait_ms,
        request_timeout_ms=int(CONNECT_TIMEOUT_S * 1000),
    )
    try:
        await asyncio.wait_for(consumer.start(), CONNECT_TIMEOUT_S)
    except BaseException:
        await consumer.stop()
        raise
    return consumer


def _record(rec: Any) -> dict[str, Any]:
    """One consumed record as JSON: its value decoded, or the error and the raw text."""
    from dagsched.schemas import BadMessage, decode

    out: dict[str, Any] = {
        "topic": rec.topic,
        "partition": rec.partition,
        "offset": rec.offset,
        "timestamp_ms": rec.timestamp,
        "key": None if rec.key is None else rec.key.decode("utf-8", "backslashreplace"),
    }
    try:
        out["value"] = decode(rec.value).model_dump(mode="json")
    except BadMessage as exc:
        out["error"] = exc.reason
        out["raw"] = None if rec.value is None else rec.value.decode("utf-8", "backslashreplace")
    return out


@topics_app.command("tail")
def tail_cmd(
    ctx: typer.Context,
    topic: str = typer.Argument(..., help="tasks, decisions, events, deadletter, decisionlog."),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start at the oldest record, not at the end."
    ),
    count: int | None = typer.Option(None, "-n", min=1, help="Stop after N records."),
    timeout_s: float | None = typer.Option(
        None, "--timeout", min=0.0, help="Stop after this many seconds (default: follow)."
    ),
    bootstrap: str | None = BOOTSTRAP,
) -> None:
    """Print TOPIC's records decoded, one JSON object per line, until -n, --timeout or Ctrl-C."""
    from aiokafka import TopicPartition

    settings = service_settings(ctx, bootstrap, None, None)

    async def main(stop: asyncio.Event) -> None:
        admin = _admin(settings)
        try:
            known = await partitions(admin)
        finally:
            await admin.close()
        name = resolve(settings, topic, set(known))
        parts = [TopicPartition(name, p) for p in known[name]]
        consumer = await _consumer(settings)
        try:
            consumer.assign(parts)
            if from_beginning:
                await consumer.seek_to_beginning(*parts)
            else:
                await consumer.seek_to_end(*parts)
            # resolve the positions now, so that "the end" is when the command started
            start = {tp.partition: await consumer.position(tp) for tp in parts}
            log.info("topics.tail.following", topic=name, offsets=start)
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            printed = 0
            while not stop.is_set() and (count is None or printed < count):
                wait_ms = 200
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    wait_ms = max(1, min(wait_ms, int(left * 1000)))
                left_n = None if count is None else count - printed
                batches = await consumer.getmany(timeout_ms=wait_ms, max_records=left_n)
                records = sorted(
                    (r for recs in batches.values() for r in recs),
                    key=lambda r: (r.timestamp, r.partition, r.offset),
                )
                for rec in records[:left_n]:
                    sys.stdout.write(json.dumps(_record(rec), allow_nan=False) + "\n")
                    printed += 1
                sys.stdout.flush()
        finally:
            await consumer.stop()

    try:
        _run(settings, main)
    except TopicsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except BrokenPipeError:
        # `| head`: the reader has what it wanted; keep the exit-time flush from failing too
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def describe(settings: Settings, names: list[str], every: bool) -> list[dict[str, Any]]:
    """Partitions, end offsets and per-group committed offsets and lag of the chosen topics:
    `names` (any form `resolve` takes), else every topic if `every`, else dagsched's own."""
    from aiokafka import TopicPartition

    admin = _admin(settings)
    consumer = None
    try:
        known = await partitions(admin)
        if names:
            chosen = [resolve(settings, n, set(known)) for n in names]
        elif every:
            chosen = sorted(known)
        else:
            chosen = [settings.topic(t) for t in TOPICS if settings.topic(t) in known]
            if not chosen:
                raise TopicsError(
                    f"no dagsched topics on {settings.kafka_bootstrap} with topic_prefix "
                    f"{settings.topic_prefix!r} (--all lists every topic)"
                )
        tps = {t: [TopicPartition(t, p) for p in known[t]] for t in chosen}
        every_tp = [tp for parts in tps.values() for tp in parts]
        consumer = await _consumer(settings)
        begin = await consumer.beginning_offsets(every_tp)
        end = await consumer.end_offsets(every_tp)
        groups = sorted(g for g, _ in await admin.list_consumer_groups())
        # Tansu answers only for partitions named explicitly; so does every broker
        committed = await asyncio.gather(
            *(admin.list_consumer_group_offsets(g, partitions=every_tp) for g in groups)
        )
        short = {settings.topic(t): t for t in TOPICS}
        rows = []
        for t, parts in tps.items():
            row: dict[str, Any] = {
                "topic": t,
                "short_name": short.get(t),
                "partitions": len(parts),
                "end_offsets": [end[tp] for tp in parts],
                "end_total": sum(end[tp] for tp in parts),
                "groups": [],
            }
            for group, offsets in zip(groups, committed, strict=True):
                at = [offsets[tp].offset if tp in offsets else -1 for tp in parts]
                if all(o < 0 for o in at):
                    continue  # this group never committed on this topic
                lag = [
                    end[tp] - (o if o >= 0 else begin[tp]) for tp, o in zip(parts, at, strict=True)
                ]
                row["groups"].append(
                    {
                        "group": group,
                        "committed": [o if o >= 0 else None for o in at],
                        "lag": lag,
                        "lag_total": sum(lag),
                    }
                )
            rows.append(row)
        return rows
    finally:
        if consumer is not None:
            await consumer.stop()
        await admin.close()


@topics_app.command("list")
def list_cmd(
    ctx: typer.Context,
    topics: list[str] | None = typer.Argument(None, help="Topics to show (default: dagsched's)."),
    every: bool = typer.Option(False, "--all", help="Every topic on the broker."),
    as_json: bool = typer.Option(False, "--json", help="One JSON object on stdout."),
    bootstrap: str | None = BOOTSTRAP,
) -> None:
    """Each topic's partitions and end offsets; per consumer group its committed offsets, lag."""
    settings = service_settings(ctx, bootstrap, None, None)

    async def main(stop: asyncio.Event) -> list[dict[str, Any]]:
        del stop
        return await describe(settings, list(topics or []), every)

    try:
        rows = _run(settings, main)
    except TopicsError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps({"bootstrap": settings.kafka_bootstrap, "topics": rows}))
        return
    _print_table(rows, settings.kafka_bootstrap)


def _print_table(rows: list[dict[str, Any]], bootstrap: str) -> None:
    from rich.console import Console
    from rich.measure import Measurement
    from rich.table import Table

    table = Table(title=f"topics on {bootstrap}", show_header=True, header_style="bold")
    table.add_column("topic")
    table.add_column("partitions", justify="right")
    table.add_column("end offsets", justify="right")
    table.add_column("group")
    table.add_column("committed", justify="right")
    table.add_column("lag", justify="right")
    for row in rows:
        head = [row["topic"], str(row["partitions"]), str(row["end_total"])]
        if not row["groups"]:
            table.add_row(*head, "-", "-", "-")
        for i, g in enumerate(row["groups"]):
            done = sum(o for o in g["committed"] if o is not None)
            table.add_row(
                *(head if i == 0 else ["", "", ""]), g["group"], str(done), str(g["lag_total"])
            )
    console = Console()
    if not console.is_terminal:  # piped: whole names for grep and awk, never "dagsched.deci…"
        wide = console.options.update_width(10_000)
        console.width = max(console.width, Measurement.get(console, wide, table).maximum)
    console.print(table)
