"""What a new user reads: every `--help` keeps its words, the demo's story fits 80 columns,
and a first command on a fresh home prints no library chatter."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
import typer
from typer.testing import CliRunner

from dagsched.cli.demo_cmds import shift_effects, tell
from dagsched.cli.main import app, run


def _commands() -> Iterator[tuple[list[str], Any]]:
    """Every command and group of the CLI with its path of names, the root first."""
    todo: list[tuple[list[str], Any]] = [([], typer.main.get_command(app))]
    while todo:
        path, command = todo.pop(0)
        yield path, command
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            todo.append(([*path, name], sub))


COMMANDS = list(_commands())


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "root")
def test_help_shows_every_option_text_whole_at_80_columns(path: list[str]):
    command = dict((" ".join(p), c) for p, c in COMMANDS)[" ".join(path)]
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=80, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    shown = _words(result.output)
    for param in command.params:
        if getattr(param, "help", None):
            assert _words(param.help) in shown, (param.name, result.output)
    doc = _words(command.help or "")
    assert doc in shown, result.output
    assert "…" not in result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80


def test_eval_help_names_its_defaults():
    result = CliRunner().invoke(app, ["eval", "--help"], terminal_width=80)
    shown = _words(result.output)
    assert "Version, models:/NAME@alias, or bundle folder [default: champion]." in shown
    assert "Comma-separated policy names [default: the model, every baseline, mcts]." in shown


def test_a_first_command_on_a_fresh_home_prints_no_mlflow_chatter(tmp_path, monkeypatch, capfd):
    # A new store: MLflow creates and migrates its tables and says so at INFO through a
    # handler of its own (installed when it is first imported, in this process or earlier).
    for name in list(os.environ):
        if name.startswith(("DAGSCHED_", "MLFLOW_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("MLFLOW_CONFIGURE_LOGGING", raising=False)
    monkeypatch.chdir(tmp_path)
    try:
        code = run(["--home", str(tmp_path), "models", "list", "--json"])
        out, err = capfd.readouterr()
    finally:
        structlog.reset_defaults()
        root = logging.getLogger()
        for handler in [h for h in root.handlers if h.get_name() == "dagsched"]:
            root.removeHandler(handler)
    assert code == 0, err
    assert (tmp_path / "mlflow.db").exists()  # the store was created by this command
    assert json.loads(out)[0]["aliases"] == ["champion"]
    assert err == ""


STORY: dict[str, Any] = {
    "served_by": "v1",
    "shift_at_s": 1234.5,
    "shift": {"at_s": 1234.5, "oom_restart_s": 3600.0, "mem_spread": 1.0,
              "neighbour_slowdown": 0.0},
    "replay": {"tasks_sent": 4321, "decisions_received": 4400, "duplicates": 0, "rejected": 3,
               "sla_attainment": 0.8123, "mean_jct_s": 1234.5678, "p95_jct_s": 5678.91,
               "cost_core_s": 1234567.89, "workflows_failed": 3},
    "settings": {"challenger_share": 0.2, "every_n_tasks": 400, "min_samples": 30,
                 "rule": "mSPRT, adjusted on log_slack", "home": "/srv/project/.dagsched/demo"},
    "versions": [
        {"version": "1", "aliases": ["champion"], "origin": "shipped", "parent": "",
         "resumed_from": "", "transitions": "", "kl_to_champion": ""},
        {"version": "2", "aliases": ["challenger", "previous"], "origin": "online-learner",
         "parent": "1", "resumed_from": "1", "transitions": "1234",
         "kl_to_champion": "1.23457e-05"},
        {"version": "13", "aliases": [], "origin": "online-learner", "parent": "1",
         "resumed_from": "12", "transitions": "12345", "kl_to_champion": "0.00123457"},
    ],
    "rounds": ["2", "13"],
    "verdicts": [{"action": "retire", "version": "2", "reason": "futility"}],
    "audit": [{"action": "promote", "version": "2", "actor": "evaluator:host",
               "reason": "better"}],
    "sla": {p: {a: {"sla_attainment": 0.75, "workflows": 100}
                for a in ("all", "champion", "challenger")}
            for p in ("before_shift", "after_shift", "all")},
}  # fmt: skip
CONTEXT = [
    {"policy": "frozen champion", "sla_attainment": 0.7, "mean_jct_s": 1300.123,
     "p95_jct_s": 6000.5, "cost_core_s": 1300000.5, "workflows_failed": 4},
    {"policy": "heft_history", "sla_attainment": 0.72, "mean_jct_s": 1250.123,
     "p95_jct_s": 5900.5, "cost_core_s": 1290000.5, "workflows_failed": 2},
]  # fmt: skip


def test_the_demo_story_fits_80_columns_without_cutting_a_word(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    tell(STORY, CONTEXT)
    out = capsys.readouterr().out
    assert "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80
    for word in ("online-learner", "heft_history", "frozen", "champion", "challenger",
                 "previous", "SLA met", "1234567.9", "1.23e-05", "0.00123"):  # fmt: skip
        assert word in out, word


def test_the_served_loop_row_shows_the_replay_after_the_searches_are_listed(capsys):
    story = STORY | {
        "settings": STORY["settings"] | {"learner": "search", "min_gain": 0.03},
        "searched": [{"windows": [2, 3], "gain": 0.04, "moved": {"mem": 0.1}}],
    }
    tell(story, CONTEXT)
    out = capsys.readouterr().out
    assert "windows 2, 3: mem +0.10 (+4.0% on the replays)" in out
    loop = next(line for line in out.splitlines() if line.startswith("served loop"))
    assert "0.812" in loop and "1234.6" in loop, loop  # the replay's SLA and mean JCT


def test_the_shift_is_told_by_the_effects_switched_on():
    story = shift_effects(STORY["shift"])
    assert story == "the retry after an OOM kill first restarts for 1 h"
    both = shift_effects({"oom_restart_s": 90.0, "mem_spread": 2.0, "neighbour_slowdown": 0.5})
    assert "restarts for 1.5 min" in both
    assert "memory peaks spread 2 times as wide" in both
    assert "up to 1.5 times slower" in both
    assert shift_effects({"oom_restart_s": 0.0, "mem_spread": 1.0}) == "no effect switched on"
