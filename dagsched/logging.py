"""Structured logs on stderr: JSON lines for machines, a readable console format for people.

stdout is reserved for command output (tables, `--json`), so every log line goes to stderr.
Standard-library loggers (ours and third-party ones) are routed through the same renderer.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, TextIO

import structlog

_HANDLER_NAME = "dagsched"
# Loggers MLflow configures on import with a handler of their own at INFO, which bypasses the
# root's level ("Creating initial MLflow database tables..." on a fresh store).
_MLFLOW_LOGGERS = ("mlflow", "alembic", "huey", "sqlalchemy.engine")


def configure_logging(
    level: str = "INFO", json: bool | None = None, stream: TextIO | None = None
) -> None:
    """Send structlog and stdlib logging at `level` and above to `stream` (default stderr).

    Standard-library loggers outside `dagsched` are held to WARNING and above, MLflow's
    included: it is told not to install its own handler, and one it installed already goes.

    `json=None` picks JSON when the stream is not a TTY and the console renderer when it is.
    Safe to call again (e.g. in tests): it replaces the previous configuration.
    """
    out: Any = stream if stream is not None else _Stderr()
    tty = _isatty(sys.stderr if stream is None else stream)
    use_json = not tty if json is None else json
    level_no = logging.getLevelNamesMapping()[level.upper()]

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any
    if use_json:
        shared += [structlog.processors.StackInfoRenderer(), structlog.processors.format_exc_info]
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=tty)

    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=out),
        cache_logger_on_first_use=False,
    )

    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    # Third-party libraries chatter at INFO (matplotlib's font cache, say): WARNING and up only.
    root.setLevel(max(level_no, logging.WARNING))
    logging.getLogger("dagsched").setLevel(level_no)
    _route_mlflow_to_root()


class _Stderr:
    """`sys.stderr` as it is at each write, not as it was when logging was configured: a
    command run in-process (a test's runner) swaps it for a stream it closes afterwards."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _route_mlflow_to_root() -> None:
    """MLflow's loggers through the root handler, at its level: not imported yet, it is asked
    (MLFLOW_CONFIGURE_LOGGING) not to set them up; imported, its set-up is undone."""
    os.environ.setdefault("MLFLOW_CONFIGURE_LOGGING", "false")
    if os.environ["MLFLOW_CONFIGURE_LOGGING"].strip().lower() in ("true", "1"):
        return  # the user asked for MLflow's own output
    for name in _MLFLOW_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers = []
        logger.setLevel(logging.NOTSET)
        logger.propagate = True


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed or fake streams
        return False
