"""Aggregation and formatting of per-run metrics."""

import math

import numpy as np

from dagsched.reporting import (
    markdown_table,
    mean_std,
    summarize,
    to_jsonable,
    write_compare_report,
)


def test_mean_std_is_the_sample_std_over_finite_values():
    stat = mean_std([1.0, 2.0, 3.0, float("nan"), None])
    assert (stat.mean, stat.std, stat.n) == (2.0, 1.0, 3)
    assert mean_std([5]).std == 0.0
    assert mean_std([]).n == 0 and math.isnan(mean_std([]).mean)


def test_summarize_groups_by_policy_in_first_seen_order():
    runs = [
        {"policy": "b", "seed": 0, "fairness": 0.5},
        {"policy": "a", "seed": 0, "fairness": 0.1},
        {"policy": "b", "seed": 1, "fairness": 0.7},
    ]
    summaries = summarize(runs, metrics=["fairness"])
    assert [(s.policy, s.runs) for s in summaries] == [("b", 2), ("a", 1)]
    assert math.isclose(summaries[0].stats["fairness"].mean, 0.6)


def test_markdown_table_cells():
    table = markdown_table(summarize([{"policy": "p", "x": 1234.5}, {"policy": "p"}], ["x"]), ["x"])
    assert table.splitlines() == ["| policy | x |", "|---|---:|", "| p | 1234.5 ± 0.0 |"]
    empty = markdown_table(summarize([{"policy": "p"}], ["x"]), ["x"])
    assert empty.splitlines()[-1] == "| p | n/a |"


def test_to_jsonable():
    assert to_jsonable({"a": np.float64(1.5), "b": (1, np.int64(2)), "c": float("inf")}) == {
        "a": 1.5,
        "b": [1, 2],
        "c": None,
    }


def test_write_compare_report(tmp_path):
    runs = [{"policy": p, "seed": s, "sla_attainment": 0.5 + s / 10} for p in "xy" for s in (0, 1)]
    report = write_compare_report(tmp_path / "out", runs)
    assert {p.name for p in report.files.values()} == {
        "compare.md", "compare.csv", "runs.csv", "compare.png",
    }  # fmt: skip
    assert all(p.stat().st_size > 0 for p in report.files.values())
    assert "0.550 ± 0.071" in report.markdown
