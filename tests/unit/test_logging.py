"""Log rendering: JSON lines off a TTY, console lines on one, never on stdout."""

import io
import json
import logging

import pytest
import structlog

from dagsched.logging import configure_logging


@pytest.fixture(autouse=True)
def _restore_logging():
    yield
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "dagsched"]:
        root.removeHandler(handler)


def test_json_lines_when_not_a_tty():
    out = io.StringIO()
    configure_logging("INFO", None, stream=out)
    structlog.get_logger().info("hello", n=1)
    structlog.get_logger().debug("hidden")
    logging.getLogger("dagsched.x").warning("from stdlib")
    logging.getLogger("thirdparty").info("chatter")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    seen = [(r["event"], r["level"]) for r in lines]
    assert seen == [("hello", "info"), ("from stdlib", "warning")]
    assert lines[0]["n"] == 1 and "timestamp" in lines[0]


def test_console_when_forced():
    out = io.StringIO()
    configure_logging("debug", json=False, stream=out)
    structlog.get_logger().debug("visible", k="v")
    text = out.getvalue()
    assert "visible" in text and "k=v" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])


def test_logs_follow_a_stderr_an_in_process_run_swapped_and_closed(capsys):
    """A command run in-process (a test's runner) configures logging while stderr is the
    runner's stream, which it closes afterwards; later log lines go to stderr as it is now."""
    import io
    import sys

    import structlog

    from dagsched.logging import configure_logging

    before = sys.stderr
    swapped = io.StringIO()
    sys.stderr = swapped
    try:
        configure_logging(json=True)
        structlog.get_logger("t").warning("during")
    finally:
        sys.stderr = before
    assert "during" in swapped.getvalue()
    swapped.close()
    structlog.get_logger("t").warning("after")  # raised on the closed stream
    assert "after" in capsys.readouterr().err
