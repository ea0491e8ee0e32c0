"""`dagsched explain` end to end against a real (private) Redis holding decisions stored the
way the daemon stores them; models from the shipped champion bundle (`--model-dir`)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time

import pytest
import structlog

from dagsched.cli.main import run
from dagsched.daemon.broker import free_port
from tests.explain.conftest import CHAMPION, dagsched
from tests.learner.test_decision_log import decision_point


@pytest.fixture
def cli(monkeypatch, tmp_path, capsys):
    """Run the CLI in this process with `env` (fast; the subprocess tests pin real streams)."""

    def invoke(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
        for name in list(os.environ):
            if name.startswith("DAGSCHED_"):
                monkeypatch.delenv(name)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(tmp_path)
        capsys.readouterr()
        code = run(list(args))
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    yield invoke
    structlog.reset_defaults()
    root = logging.getLogger()
    for handler in [h for h in root.handlers if h.get_name() == "dagsched"]:
        root.removeHandler(handler)


def one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> str:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    for f in fragments:
        assert f in lines[0], lines[0]
    return lines[0]


def test_explain_json_and_png_end_to_end(stack, champion, sim_point, tmp_path):
    ids = sim_point[0].node_ids
    stack.store_nodes(ids)
    dec = stack.store_gnn(champion, sim_point, "wf-e2e")
    tid = f"wf-e2e/{dec.task}"
    png = tmp_path / "why.png"
    proc = dagsched(
        "explain", "--task-id", tid, "--json", "--png", str(png),
        "--model-dir", str(CHAMPION), env=stack.env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["task_id"] == tid and d["attempt"] == 0  # latest attempt found
    assert d["model_version"] == "v1" and d["arm"] == "champion"
    assert d["chosen"]["node"] == dec.node == ids[d["chosen"]["index"]]
    assert d["runner_up"]["index"] != d["chosen"]["index"]
    assert d["reproduces_log"]["node"] is True and d["reproduces_log"]["values"] is True
    top = d["targets"]["logit_chosen"]["top"]
    assert top and set(top[0]) == {"group", "entity", "feature", "value", "contribution"}
    for name in ("logit_chosen", "logit_runner_up", "logit_gap", "cpu", "mem", "max_retries"):
        t = d["targets"][name]
        assert t["ok"] is True and t["error"] <= t["tolerance"]
    assert d["targets"]["cpu"]["value"] == pytest.approx(dec.cpu, abs=1e-3)
    assert d["separation"]["node_features"]
    assert d["completeness"]["ok"] is True
    assert len(d["node_heatmap"]["contributions"]) == len(ids)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_for_a_later_attempt(cli, stack, champion, sim_point):
    stack.store_gnn(champion, sim_point, "wf-t", attempt=0)
    tid = f"wf-t/{stack.store_gnn(champion, sim_point, 'wf-t', attempt=1).task}"
    proc = cli("explain", "--task-id", tid, "--model-dir", str(CHAMPION), env=stack.env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"{tid} attempt 1" in out  # the latest attempt by default
    assert "runner-up" in out and "What separated" in out and "contribution" in out
    assert "completeness:" in out and ": ok" in out


def test_a_fallback_decision_says_so(cli, stack):
    stack.store_fallback("wf-fb", 2, "node-0004")
    proc = cli("explain", "--task-id", "wf-fb/2", env=stack.env)
    assert proc.returncode == 0, proc.stderr
    assert "heuristic fallback" in proc.stdout and "no model attributions" in proc.stdout
    assert "node-0004" in proc.stdout
    proc = cli("explain", "--task-id", "wf-fb/2", "--json", env=stack.env)
    d = json.loads(proc.stdout)
    assert d["fallback"] is True and d["targets"] is None and d["arm"] == "fallback"


def test_unknown_task_id_is_one_line_error(stack, tmp_path):
    proc = dagsched("explain", "--task-id", "wf-nope/7", env=stack.env, cwd=tmp_path)
    one_line_error(proc, "unknown task id", "wf-nope/7")


def test_other_user_errors(cli, stack, champion, sim_point, tmp_path):
    one_line_error(cli("explain", "--task-id", "no-slash", env=stack.env), "WORKFLOW_ID/TASK_INDEX")
    proc = cli("explain", "--task-id", "wf/1", "--attempt", "4", env=stack.env)
    one_line_error(proc, "attempt 4")
    one_line_error(cli("explain", "--sample", "3", env=stack.env), "--out")
    down = {**stack.env, "DAGSCHED_REDIS_URL": f"redis://127.0.0.1:{free_port()}/0"}
    one_line_error(cli("explain", "--task-id", "wf/1", env=down), "cannot read Redis")
    task = stack.store_gnn(champion, sim_point, "wf-m", version="v7").task
    empty = tmp_path / "empty"
    empty.mkdir()
    args = ("explain", "--task-id", f"wf-m/{task}", "--model-dir", str(empty))
    one_line_error(cli(*args, env=stack.env), "no model bundle for version 'v7'")
    stack.store_gnn(champion, sim_point, "wf-n", version="bundle:local")
    n_args = ("explain", "--task-id", f"wf-n/{task}")
    one_line_error(cli(*n_args, env=stack.env), "not a registry version")
    stack.expire_log(f"wf-n/{task}", 0)  # the decision log expired
    one_line_error(cli(*n_args, env=stack.env), "not stored any more")


def test_sample_report_over_versions(cli, stack, champion, sim_point, tmp_path):
    t0 = time.time() - 60
    for i in range(3):  # v1 was champion, then v2 was promoted
        stack.store_gnn(champion, sim_point, f"wf-s{i}", version="v1", decided_at=t0 + i)
        stack.store_gnn(champion, sim_point, f"wf-s{10 + i}", version="v2", decided_at=t0 + 10 + i)
    # older than the sample's 7 newest: left out
    stack.store_gnn(
        champion, sim_point, "wf-s20", version="v2", arm="challenger", decided_at=t0 - 50
    )
    stack.store_fallback("wf-s", 30, "node-0001", decided_at=t0)
    out = tmp_path / "report"
    proc = cli(
        "explain", "--sample", "7", "--out", str(out), "--model-dir", str(CHAMPION),
        "--json", env=stack.env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["decisions"] == 7 and d["stored"] == 8 and d["fallback"] == 1
    assert {v: x["decisions"] for v, x in d["versions"].items()} == {"v1": 3, "v2": 3}
    assert all(x["incomplete"] == 0 for x in d["versions"].values())
    assert d["promotion"]["previous"] == "v1" and d["promotion"]["current"] == "v2"
    md = (out / "explain.md").read_text()
    assert "## Model v1" in md and "## Model v2" in md and "After the last promotion" in md
    assert "`node." in md and "| feature |" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["explain_promotion.png", "explain_v1.png", "explain_v2.png"]
    assert all((out / p).read_bytes()[:4] == b"\x89PNG" for p in pngs)


def test_explain_and_sample_read_the_compact_decision_log(cli, stack, champion, tmp_path):
    """Decisions logged as the daemon logs them (one `decision_batch` per
    policy call in the Redis streams): the observation of any of them is replayed."""
    view, tvs = decision_point(12)
    stack.store_nodes(view.node_ids)
    decisions = stack.store_batch(champion, view, tvs)
    dec = decisions[7]  # its observation depends on seven earlier placements of the call
    args = ("--model-dir", str(CHAMPION))
    proc = cli("explain", "--task-id", f"{dec.workflow_id}/{dec.task}", "--json", *args,
               env=stack.env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["chosen"]["node"] == dec.node and d["model_version"] == "v1"
    assert d["reproduces_log"]["node"] is True and d["reproduces_log"]["values"] is True
    assert d["completeness"]["ok"] is True
    out = tmp_path / "report"
    proc = cli("explain", "--sample", "4", "--out", str(out), "--json", *args, env=stack.env)
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    assert d["decisions"] == 4 and d["stored"] == 12 and d["fallback"] == 0
    assert d["versions"]["v1"]["decisions"] == 4
