"""The `dagsched` CLI as a user runs it: a real process, real exit codes, stdout vs stderr."""

import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from dagsched.cli.main import run
from dagsched.reporting import METRICS

REPO = Path(__file__).resolve().parents[2]

RUN_KEYS = {
    "policy", "workflows", "tasks", "sla_attainment", "mean_jct_s", "p95_jct_s", "makespan_s",
    "cost_core_s", "waste_core_s", "fairness", "migrations", "task_failures", "workflows_failed",
    "wall_s",
}  # fmt: skip


def dagsched(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m dagsched.cli.main ARGS` in `cwd` with a clean DAGSCHED_* environment."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("DAGSCHED_")}
    base["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), base.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "dagsched.cli.main", *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run the CLI in this process (fast): returns a CompletedProcess-like result.

    The subprocess tests below pin down real exit codes and streams; these cover the many
    error paths through the same `run()` without paying an interpreter start each.
    """
    for name in list(os.environ):
        if name.startswith("DAGSCHED_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)

    def invoke(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        code = run(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    yield invoke
    # configure_logging bound structlog and a root handler to capsys' streams: undo that
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "dagsched"]:
        root.removeHandler(handler)


def wfformat_doc() -> dict:
    """A minimal valid WfFormat 1.5 instance: a -> b."""
    return {
        "name": "tiny",
        "schemaVersion": "1.5",
        "workflow": {
            "specification": {
                "tasks": [
                    {"name": "a", "id": "1", "parents": [], "children": ["2"],
                     "inputFiles": [], "outputFiles": ["f"]},
                    {"name": "b", "id": "2", "parents": ["1"], "children": [],
                     "inputFiles": ["f"], "outputFiles": []},
                ],
                "files": [{"id": "f", "sizeInBytes": 1000}],
            },
            "execution": {"tasks": [{"id": "1", "runtimeInSeconds": 5.0},
                                    {"id": "2", "runtimeInSeconds": 3.0}]},
        },
    }  # fmt: skip


# --- as a real process: exit codes, stdout and stderr as a user sees them -------------------


def test_help(tmp_path):
    proc = dagsched("--help", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Usage" in proc.stdout and "sim" in proc.stdout


def test_unknown_policy(tmp_path):
    proc = dagsched("sim", "run", "--policy", "nope", cwd=tmp_path)
    assert_one_line_error(proc, "nope", "heft")


def test_malformed_wfformat_json(tmp_path):
    (tmp_path / "bad.json").write_text('{"schemaVersion": "1.5", ')
    proc = dagsched("sim", "run", "--policy", "heft", "--wfformat", "bad.json", cwd=tmp_path)
    assert_one_line_error(proc, "bad.json")


def test_run_json_is_exactly_one_object(tmp_path):
    proc = dagsched(
        "--log-level", "DEBUG", "sim", "run", "--policy", "heft", "--workflows", "3",
        "--json", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1
    metrics = json.loads(proc.stdout)
    assert isinstance(metrics, dict)
    assert metrics.keys() >= RUN_KEYS
    assert metrics["policy"] == "heft"
    assert metrics["workflows"] == 3
    assert "sim.run.start" in proc.stderr  # logs go to stderr, never stdout


# --- in this process: the many other paths -------------------------------------------------


@pytest.mark.parametrize(
    "args", [["sim", "--help"], ["sim", "run", "--help"], ["sim", "compare", "--help"]]
)
def test_help_on_every_command(cli, args):
    result = cli(*args)
    assert result.returncode == 0, result.stderr
    assert "Usage" in result.stdout


def test_bare_group_shows_help_and_exits_2(cli):
    result = cli("sim")
    assert result.returncode == 2
    assert "run" in result.stdout and "compare" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["sim", "run", "--policy", "heft", "--no-such-flag"],
        ["sim", "run", "--policy", "heft", "--seed", "abc"],
        ["sim", "run", "--policy", "heft", "--workflows", "0"],
        ["sim", "run"],
        ["sim", "run", "--policy", "heft", "--workflows", "2", "--wfformat", "x.json"],
        ["sim", "compare", "--policies", "heft,nope", "--out", "o"],
        ["sim", "compare", "--policies", "heft"],
        ["sim", "nope"],
    ],
)
def test_bad_flags(cli, args):
    assert_one_line_error(cli(*args))


def test_bad_setting_from_a_flag(cli):
    assert_one_line_error(cli("sim", "run", "-p", "heft", "--load", "5"), "sim.workload.load")


def test_bad_setting_from_env(cli, monkeypatch):
    monkeypatch.setenv("DAGSCHED_SIM__WORKLOAD__NOPE", "1")
    assert_one_line_error(cli("sim", "run", "-p", "heft"), "unknown setting sim.workload.nope")


def test_unknown_profile(cli):
    assert_one_line_error(cli("--profile", "staging", "sim", "run", "-p", "heft"), "staging")


def test_missing_wfformat_file(cli):
    result = cli("sim", "run", "--policy", "heft", "--wfformat", "missing.json")
    assert_one_line_error(result, "missing.json")


def test_empty_wfformat_dir(cli, tmp_path):
    (tmp_path / "empty").mkdir()
    assert_one_line_error(cli("sim", "run", "-p", "heft", "--wfformat", "empty"), "empty")


def test_invalid_wfformat_document(cli, tmp_path):
    (tmp_path / "wrong.json").write_text(json.dumps({"schemaVersion": "1.5"}))
    assert_one_line_error(cli("sim", "run", "-p", "heft", "--wfformat", "wrong.json"), "wrong.json")


def test_run_imports_wfformat_dir(cli, tmp_path):
    wf_dir = tmp_path / "wfs"
    wf_dir.mkdir()
    for name in ("a.json", "b.json"):
        (wf_dir / name).write_text(json.dumps(wfformat_doc()))
    (wf_dir / "notes.txt").write_text("not a workflow")
    result = cli("sim", "run", "-p", "sjf", "--wfformat", "wfs", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["workflows"] == 2


def test_run_prints_a_table(cli):
    result = cli("sim", "run", "--policy", "random", "--workflows", "2")
    assert result.returncode == 0, result.stderr
    assert "sla_attainment" in result.stdout


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_compare_writes_the_report(tmp_path):
    proc = dagsched(
        "sim", "compare", "--seeds", "2", "--policies", "random,heft", "--workflows", "5",
        "--out", "report", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "report"

    markdown = (out / "compare.md").read_text()
    assert proc.stdout == markdown
    rows = [line for line in markdown.splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 2  # header, separator, one row per policy
    assert rows[0].split("|")[1:-1] == [f" {c} " for c in ("policy", *METRICS)]
    assert rows[2].startswith("| random |") and rows[3].startswith("| heft |")
    assert "±" in rows[2]

    summary = read_csv(out / "compare.csv")
    assert [r["policy"] for r in summary] == ["random", "heft"]
    assert {f"{m}_{s}" for m in METRICS for s in ("mean", "std")} <= summary[0].keys()
    assert summary[0]["runs"] == "2"

    runs = read_csv(out / "runs.csv")
    assert [(r["policy"], r["seed"]) for r in runs] == [
        ("random", "0"), ("random", "1"), ("heft", "0"), ("heft", "1"),
    ]  # fmt: skip
    assert runs[0].keys() >= RUN_KEYS

    assert (out / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_parallel_grid_matches_serial():
    from dagsched.cli.sim_grid import run_grid
    from dagsched.sim.config import ScenarioConfig, WorkloadConfig

    scenario = ScenarioConfig(workload=WorkloadConfig(workflows=3))
    seen = []
    serial = run_grid(scenario, ["sjf", "tetris"], [0, 1])
    parallel = run_grid(
        scenario, ["sjf", "tetris"], [0, 1], jobs=2, progress=lambda done, total: seen.append(done)
    )
    drop_wall = [{k: v for k, v in r.items() if k != "wall_s"} for r in serial]
    assert drop_wall == [{k: v for k, v in r.items() if k != "wall_s"} for r in parallel]
    assert [(r["policy"], r["seed"]) for r in parallel] == [
        ("sjf", 0), ("sjf", 1), ("tetris", 0), ("tetris", 1),
    ]  # fmt: skip
    assert seen == [0, 1, 2, 3, 4]


def test_eval_over_loads_reports_utilisation_and_draws_jct_against_load(tmp_path, cli):
    # in this process (the console script's run()): the next test runs eval as a real process
    out = tmp_path / "eval"
    r = cli(
        "--home", str(tmp_path / "home"), "eval", "--model", str(REPO / "models" / "champion"),
        "--policies", "heft_history,random", "--seeds", "1", "--workflows", "4",
        "--loads", "0.3,0.9", "--scenarios", "load:0.3,load:0.9", "--out", str(out), "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(x["policy"], x["scenario"]) for x in rows} == {
        (p, s) for p in ("heft_history", "random") for s in ("load:0.3", "load:0.9")
    }
    for row in rows:
        assert 0 < row["used_util"] < row["reserved_util"] <= 1.0
        assert row["oom_kills"] >= 0
    assert (out / "jct_vs_load.png").stat().st_size > 0
    bad = cli("--home", str(tmp_path / "home"), "eval", "--loads", "0.5,3", "--out", str(out))
    assert bad.returncode == 2 and "--loads" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


def test_eval_writes_the_report_and_json_rows(tmp_path, cli):
    out = tmp_path / "eval"
    r = dagsched(
        "--home", str(tmp_path / "home"), "eval", "--model", str(REPO / "models" / "champion"),
        "--policies", "champion,heft,random", "--seeds", "1", "--workflows", "3",
        "--scenarios", "default,slack:tight", "--out", str(out), "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(x["policy"], x["scenario"]) for x in rows} == {
        (p, s)
        for p in (str(REPO / "models" / "champion"), "heft", "random")
        for s in ("default", "slack:tight")
    }
    for row in rows:
        assert 0 <= row["sla_attainment"] <= 1 and row["mean_jct_s"] > 0
        assert row["decision_ms"] > 0
    for name in ("eval.md", "eval.csv", "eval.json", "sla.png", "jct.png"):
        assert (out / name).stat().st_size > 0
    bad = cli(
        "--home", str(tmp_path / "home"), "eval", "--model", str(REPO / "models" / "champion"),
        "--policies", "champion,nonsense", "--out", str(out),
    )  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "nonsense" in bad.stderr
