"""The quick chaos run (`bench/chaos.py --quick`) for two faults: Redis SIGKILLed and
restarted empty, and a daemon replica SIGKILLed under load. Real processes throughout: Tansu,
redis-server, two `dagsched daemon` replicas, a learner and an evaluator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import clone_mlflow_home

REPO = Path(__file__).resolve().parents[2]


def test_quick_chaos_loses_and_changes_no_decision(tmp_path: Path, mlflow_template: Path) -> None:
    home = clone_mlflow_home(mlflow_template, tmp_path / "home")  # the store exists already
    out = tmp_path / "chaos.json"
    done = subprocess.run(
        [
            sys.executable, str(REPO / "bench" / "chaos.py"), "--quick", "--json",
            "--faults", "redis_kill,replica_kill", "--no-registry",
            "--home", str(home), "--out", str(out),
        ],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert out.exists(), done.stderr[-3000:]
    doc = json.loads(out.read_text())
    for name in ("redis_kill", "replica_kill"):
        row = doc["faults"][name]
        assert row["sent"] > 100, row  # load ran through the fault
        assert row["decided"] == row["sent"], (name, row)
        assert (row["lost"], row["conflicting"], row["dead_lettered"]) == (0, 0, 0), (name, row)
        assert row["first_decision_s"] is not None  # decisions came after recovery
    assert doc["faults"]["replica_kill"]["notes"]["answers_again"] is True
    assert all(doc["alive_at_end"].values()), doc["alive_at_end"]
    assert set(doc["alive_at_end"]) >= {"daemon-0", "daemon-1", "learner", "evaluator", "redis"}
    assert doc["restarts"] == {"daemon-0": 1}
