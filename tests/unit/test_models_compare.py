"""`dagsched models compare`: the paired replay on a simulated window, from the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dagsched.cli.main import run


def test_compare_two_baselines_writes_table_json_and_chart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "diffs.png"
    argv = ["--profile", "test", "models", "compare", "heft_history", "random",
            "--window", "15m", "--replays", "2", "--json", "--png", str(png)]  # fmt: skip
    assert run(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"] == "heft_history" and doc["b"] == "random"
    diffs = [d for w in doc["windows"] for d in w["diffs"]]
    assert len(diffs) == 2 * len(doc["windows"]) >= 2
    assert all(d["sla"] <= 0 for d in diffs)  # random placement is never better here
    assert doc["fidelity"]["jct_err"] < 0.15
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["models", "compare", "heft_history", "random", "--window", "2x"], "--window"),
        (["models", "compare", "heft_history", "random", "--window", "-1h"], "--window"),
        (["models", "compare", "heft_history", "random", "--png", "/no/such/dir/x.png"], "--png"),
    ],
)
def test_compare_bad_input_is_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and needle in err and "\n" not in err
