"""`dagsched broker | daemon | updater` and `dagsched sim replay`: the long-running services.

Every service command takes `--bootstrap`, `--redis-url` and `--home` (each overriding its
setting and `DAGSCHED_*` variable); the daemon also takes `--metrics-port`. SIGTERM and Ctrl-C
drain and exit cleanly.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import structlog
import typer

from dagsched.cli.console import print_metrics, progress_bar, stderr_is_tty
from dagsched.cli.context import state
from dagsched.settings import Settings

log = structlog.get_logger(__name__)

BOOTSTRAP = typer.Option(
    None,
    "--bootstrap",
    help="Kafka HOST:PORT (env DAGSCHED_KAFKA_BOOTSTRAP, default 127.0.0.1:9092).",
)
REDIS_URL = typer.Option(None, "--redis-url", help="Redis URL (env DAGSCHED_REDIS_URL).")
HOME = typer.Option(None, "--home", help="State folder (env DAGSCHED_HOME).")


def service_settings(
    ctx: typer.Context,
    bootstrap: str | None,
    redis_url: str | None,
    home: Path | None,
    extra: dict[str, Any] | None = None,
) -> Settings:
    """Settings with the service flags applied over every other layer."""
    flags: dict[str, Any] = {
        "kafka_bootstrap": bootstrap,
        "redis_url": redis_url,
        "home": home,
        **(extra or {}),
    }
    return state(ctx).settings({k: v for k, v in flags.items() if v is not None})


def _run_until_signal(main: Any) -> None:
    """Run coroutine function `main(stop_event)`; SIGTERM/SIGINT set the event."""

    async def runner() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await main(stop)

    asyncio.run(runner())


def _serve(settings: Settings, main: Any) -> None:
    """A long-running service: create the topics (where allowed), then `main(stop)` until
    SIGTERM/SIGINT."""
    from dagsched.daemon.broker import ensure_topics

    async def with_topics(stop: asyncio.Event) -> None:
        try:
            await ensure_topics(settings)
        except Exception as exc:  # a real cluster may forbid topic creation: they may exist
            log.warning("topics.not_created", error=str(exc))
        await main(stop)

    _run_until_signal(with_topics)


def broker_cmd(
    ctx: typer.Context,
    port: int = typer.Option(9092, "--port", min=0, max=65535, help="Port on 127.0.0.1."),
    partitions: int | None = typer.Option(
        None, "--partitions", min=1, help="Partitions per topic (topics.partitions, default 6)."
    ),
    home: Path | None = HOME,
) -> None:
    """Run the embedded Kafka-compatible broker (Tansu, memory only) and create the topics."""
    from dagsched.daemon.broker import embedded_broker

    extra = {"topics.partitions": partitions} if partitions is not None else {}
    settings = service_settings(ctx, f"127.0.0.1:{port}", None, home, extra)

    async def main(stop: asyncio.Event) -> None:
        async with embedded_broker(settings, port) as broker:
            log.info("broker.ready", bootstrap=broker.bootstrap, memory_only=True)
            typer.echo(f"broker listening on {broker.bootstrap} (memory only)")
            await stop.wait()
        log.info("broker.stopped")

    _run_until_signal(main)


def daemon_cmd(
    ctx: typer.Context,
    bootstrap: str | None = BOOTSTRAP,
    redis_url: str | None = REDIS_URL,
    home: Path | None = HOME,
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", min=0, max=65535, help="Port of /metrics and /healthz."
    ),
    updater: bool = typer.Option(
        True, "--updater/--no-updater", help="Also apply dagsched.events to Redis here."
    ),
    registry: bool = typer.Option(
        True, "--registry/--no-registry", help="Serve MLflow @champion (else the heuristic only)."
    ),
) -> None:
    """Serve placements: consume dagsched.tasks, produce decisions, until SIGTERM."""
    from dagsched.daemon.service import Daemon, set_torch_threads

    extra = {"daemon.metrics_port": metrics_port} if metrics_port is not None else {}
    settings = service_settings(ctx, bootstrap, redis_url, home, extra)
    set_torch_threads(settings)

    async def main(stop: asyncio.Event) -> None:
        daemon = Daemon(settings, run_updater=updater, registry=registry, freeze_gc=True)
        run = asyncio.create_task(daemon.async_run())
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({run, waiter}, return_when=asyncio.FIRST_COMPLETED)
        daemon.stop()
        waiter.cancel()
        await run

    _serve(settings, main)


def updater_cmd(
    ctx: typer.Context,
    bootstrap: str | None = BOOTSTRAP,
    redis_url: str | None = REDIS_URL,
    home: Path | None = HOME,
) -> None:
    """Apply dagsched.events to Redis (node state, reservations) until SIGTERM."""
    from dagsched.daemon.kafka import make_producer
    from dagsched.daemon.metrics import DaemonMetrics
    from dagsched.daemon.redis_state import RedisState, connect
    from dagsched.daemon.updater import Updater

    settings = service_settings(ctx, bootstrap, redis_url, home)

    async def main(stop: asyncio.Event) -> None:
        redis = connect(settings)
        producer = make_producer(settings)
        await producer.start()
        try:
            upd = Updater(settings, RedisState(redis, settings), producer, DaemonMetrics())
            await upd.run(stop)
        finally:
            await producer.stop()
            await redis.aclose()

    _serve(settings, main)


def learner_cmd(
    ctx: typer.Context,
    bootstrap: str | None = BOOTSTRAP,
    redis_url: str | None = REDIS_URL,
    home: Path | None = HOME,
) -> None:
    """Join decisions with outcomes; every `learner.every_n_tasks` completed tasks fine-tune
    the champion's actor heads and register the result as `@challenger`."""
    from dagsched.learner.services import LearnerService

    settings = service_settings(ctx, bootstrap, redis_url, home)

    async def main(stop: asyncio.Event) -> None:
        await LearnerService(settings).run(stop)

    _serve(settings, main)


def evaluator_cmd(
    ctx: typer.Context,
    bootstrap: str | None = BOOTSTRAP,
    redis_url: str | None = REDIS_URL,
    home: Path | None = HOME,
) -> None:
    """A/B-test the challenger against the champion (mSPRT); promote, retire or roll back.
    One JSON verdict per line on stdout. Only the holder of the Redis lease acts."""
    from dagsched.learner.services import EvaluatorService

    settings = service_settings(ctx, bootstrap, redis_url, home)

    def emit(record: dict[str, Any]) -> None:
        typer.echo(json.dumps(record, default=str))

    async def main(stop: asyncio.Event) -> None:
        await EvaluatorService(settings, emit).run(stop)

    _serve(settings, main)


def replay_cmd(
    ctx: typer.Context,
    rate: float | None = typer.Option(
        None, "--rate", min=0.0, help="Workflow arrivals per simulated second (default: --load)."
    ),
    speedup: float = typer.Option(
        0.0, "--speedup", min=0.0, help="Simulated seconds per wall second; 0 = no pacing."
    ),
    duration: str = typer.Option(
        "20wf",
        "--duration",
        help="How much to replay: simulated seconds ('600', '600s') or workflows ('50wf').",
    ),
    fault_rate: float | None = typer.Option(
        None, "--fault-rate", help="Node crashes per node-hour (sim.faults.node_failure_per_hour)."
    ),
    malformed: float = typer.Option(
        0.0, "--malformed", min=0.0, max=1.0, help="Share of extra, deliberately bad messages."
    ),
    seed: int = typer.Option(0, "--seed", min=0, help="Random seed of the workload and faults."),
    timeout_s: float = typer.Option(
        60.0, "--timeout", min=0.1, help="Seconds to wait for one decision before giving up."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
    bootstrap: str | None = BOOTSTRAP,
    redis_url: str | None = REDIS_URL,
    home: Path | None = HOME,
) -> None:
    """Play the job queue over Kafka: publish workflows and ready tasks, apply the daemon's
    decisions in simulated time, publish task and node events; print the run's metrics."""
    from aiokafka.errors import KafkaError

    from dagsched.daemon.replay import ReplayConfig, ReplayError, parse_duration, replay
    from dagsched.reporting import to_jsonable

    try:
        seconds, workflows = parse_duration(duration)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--duration'") from None
    extra = {"sim.faults.node_failure_per_hour": fault_rate} if fault_rate is not None else {}
    settings = service_settings(ctx, bootstrap, redis_url, home, extra)
    cfg = ReplayConfig(
        rate=rate,
        speedup=speedup,
        duration_s=seconds,
        workflows=workflows,
        malformed=malformed,
        seed=seed,
        decision_timeout_s=timeout_s,
    )
    with progress_bar("replay", enabled=stderr_is_tty() and not as_json) as bar:

        async def main(stop: asyncio.Event) -> dict[str, Any]:
            return await replay(settings, cfg, stop=stop, progress=bar)

        result: dict[str, Any] = {}

        async def keep(stop: asyncio.Event) -> None:
            result.update(await main(stop))

        try:
            _run_until_signal(keep)
        except ReplayError as exc:
            typer.echo("error: " + " ".join(str(exc).split()), err=True)
            raise typer.Exit(2) from None
        except KafkaError as exc:
            typer.echo(f"error: broker {settings.kafka_bootstrap} unreachable: {exc}", err=True)
            raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps(to_jsonable(result), allow_nan=False))
    else:
        print_metrics(result, title=f"replay, seed {seed}")
