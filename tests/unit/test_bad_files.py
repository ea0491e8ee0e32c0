"""Generated bad settings (YAML profiles, DAGSCHED_* variables) and bad WfFormat files, through
the CLI in this process: each is a one-line error and exit code 2, never a traceback; input
that happens to be valid runs (exit 0)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dagsched.settings import Settings
from tests.bad_input import BAD_NUMBERS, json_values, number_paths, with_raw
from tests.unit.test_cli import assert_one_line_error, cli, wfformat_doc

__all__ = ["cli"]  # the fixture, shared with test_cli.py

CLI_PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
RUN = ("sim", "run", "--policy", "random", "--workflows", "1", "--json")


def ok_or_one_line_error(proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        assert_one_line_error(proc)


def leaf_paths(data: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every setting that holds a value (not a mapping), as a key path."""
    if isinstance(data, dict):
        return [p for k, v in data.items() for p in leaf_paths(v, (*path, k))]
    return [path]


LEAVES = leaf_paths(Settings().model_dump(mode="json"))
# YAML spellings of values no setting accepts (a number that is not, or is not finite, a
# mapping or list where a scalar belongs, a nest deeper than any setting, an endless integer)
BAD_YAML_VALUES = [
    ".nan", ".inf", "-.inf", "{a: 1}", "[" * 40 + "]" * 40,
    "9" * 5000, "!!python/object:os.system ls", "2020-01-01", "[1, 2",
]  # fmt: skip


def nested_yaml(path: tuple[str, ...], value: str) -> str:
    """`value` at `path`, in block style."""
    lines = [f"{'  ' * i}{key}:" for i, key in enumerate(path[:-1])]
    return "\n".join([*lines, f"{'  ' * (len(path) - 1)}{path[-1]}: {value}"]) + "\n"


def configs(tmp_path: Path, text: str | bytes) -> str:
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    (folder / "default.yaml").write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(folder)


@CLI_PROPERTY
@given(st.text(max_size=300) | st.binary(max_size=100))
def test_any_settings_file_runs_or_is_one_line_error(cli, tmp_path, text):
    ok_or_one_line_error(cli("--config-dir", configs(tmp_path, text), *RUN))


@CLI_PROPERTY
@given(st.sampled_from(LEAVES), st.sampled_from(BAD_YAML_VALUES))
def test_a_bad_value_in_a_profile_is_one_line_error(cli, tmp_path, path, value):
    if path == ("profile",):
        return  # the profile layer sets this one itself
    if path == ("sim", "workload", "workflows"):
        return  # RUN's --workflows replaces the file's value before anything reads it
    proc = cli("--config-dir", configs(tmp_path, nested_yaml(path, value)), *RUN)
    assert_one_line_error(proc)
    line = proc.stderr.strip()
    assert ".".join(path) in line or "default.yaml" in line, line


@CLI_PROPERTY
@given(st.lists(st.from_regex(r"[a-z_]{1,12}", fullmatch=True), min_size=1, max_size=4))
@example(path=["no"])  # YAML 1.1 reads it as the boolean False
@example(path=["sim", "on"])
def test_an_unknown_key_is_named(cli, tmp_path, path):
    known = {".".join(p[: len(path)]) for p in LEAVES}
    if ".".join(path) in known or any(".".join(p).startswith(".".join(path) + ".") for p in LEAVES):
        return
    proc = cli("--config-dir", configs(tmp_path, nested_yaml(tuple(path), "1")), *RUN)
    assert_one_line_error(proc, "unknown setting")


@CLI_PROPERTY
@given(
    st.sampled_from([p for p in LEAVES if p != ("profile",)]),
    st.sampled_from(["nan", "inf", "-inf", "[" * 5000 + "]" * 5000, '{"a": ', "[1e999]", "x"]),
)
def test_a_bad_environment_variable_is_one_line_error(cli, path, value):
    name = "DAGSCHED_" + "__".join(path).upper()
    os.environ[name] = value
    try:
        proc = cli(*RUN)
    finally:
        del os.environ[name]
    if proc.returncode == 0:  # a value some string setting takes as it is ("x" as a topic name)
        return
    assert_one_line_error(proc)


def wfformat_file(tmp_path: Path, content: bytes) -> str:
    (tmp_path / "wf.json").write_bytes(content)
    return str(tmp_path / "wf.json")


WF = ("sim", "run", "--policy", "random", "--json", "--wfformat")


@CLI_PROPERTY
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_wfformat_file_is_one_line_error(cli, tmp_path, content):
    proc = cli(*WF, wfformat_file(tmp_path, content))
    assert_one_line_error(proc)


@CLI_PROPERTY
@given(st.data())
def test_a_wfformat_document_with_a_bad_number_runs_or_is_one_line_error(cli, tmp_path, data):
    doc = wfformat_doc()
    path = data.draw(st.sampled_from(number_paths(doc)))
    token = data.draw(st.sampled_from([*BAD_NUMBERS, b"1e12", b"1e20", b"9" * 400]))
    proc = cli(*WF, wfformat_file(tmp_path, with_raw(doc, path, token)))
    ok_or_one_line_error(proc)
    if token in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1", b"1e20", b"9" * 400):
        assert proc.returncode == 2


@CLI_PROPERTY
@given(st.integers(65, 100_000), st.sampled_from(["[", '{"workflow": ']))
def test_a_deeply_nested_wfformat_file_is_one_line_error(cli, tmp_path, n, opener):
    closer = "]" if opener == "[" else "}"
    content = (opener * n + "1" + closer * n).encode()
    assert_one_line_error(cli(*WF, wfformat_file(tmp_path, content)), "nested deeper than 64")


def test_yes_no_on_off_are_text_as_names_and_booleans_as_values(tmp_path: Path) -> None:
    """Settings files read YAML 1.2's booleans: `off` is still a boolean value for a boolean
    setting (the field parses the text), while a setting named `no` is a name."""
    from dagsched.settings import read_yaml

    path = tmp_path / "p.yaml"
    path.write_text("train:\n  curriculum: off\n  reward_norm: yes\nno: 1\n")
    data = read_yaml(path)
    assert data["no"] == 1 and data["train"] == {"curriculum": "off", "reward_norm": "yes"}
    s = Settings.model_validate({"train": data["train"]})
    assert s.train.curriculum is False and s.train.reward_norm is True
