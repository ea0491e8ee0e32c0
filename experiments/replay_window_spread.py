"""Does the replay judge's spread between windows carry anything beyond replay noise?

For each run of `bench/replay_interference.py` given, per version (the variant, the
float-error copy): Cochran's Q of the windows' mean paired JCT differences, each weighted by
K / s^2 of its replays, summed over the runs. Under "no window-level effect" (each window's
replays centre on one common mean) Q is chi-squared with (windows - runs) degrees of
freedom. A change worth nothing should show none; a change that relieves congestion should
(its gain is nil while the cluster fills and largest at its peak). This decides what the
paired test takes as its variance (`evaluator.replay.variance`, docs/concepts/judging.md).

    .venv/bin/python experiments/replay_window_spread.py [FILE ...] [--out FILE]

Without files: the ten runs the rule was decided on (`RUNS`), all made before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from scipy import stats

RESULTS = Path("experiments/results")
RUNS = [
    RESULTS / "replay_interference_warmup200.json",
    Path("bench/results/replay_interference_baseline_quick.json"),
    Path("bench/results/replay_interference_quick.json"),
    Path("bench/results/replay_interference_warmup100.json"),
    RESULTS / "replay_interference_1000/replay_interference.json",
    RESULTS / "replay_interference_release200.json",
    RESULTS / "replay_interference_warmup1000_seed0/replay_interference.json",
    RESULTS / "replay_interference_warmup1000_seed1/replay_interference.json",
]


def q_of(windows: list[dict[str, Any]]) -> tuple[float, int]:
    """(Q, degrees of freedom) over one run's windows with at least two replays."""
    means, weights = [], []
    for w in windows:
        xs = [float(d["jct"]) for d in w["diffs"]]
        if len(xs) < 2:
            continue  # refused on fidelity: no replays were added
        means.append(statistics.fmean(xs))
        weights.append(len(xs) / max(statistics.variance(xs), 1e-12))
    if len(means) < 2:
        return 0.0, 0
    mu = sum(m * w for m, w in zip(means, weights, strict=True)) / sum(weights)
    q = sum(w * (m - mu) ** 2 for m, w in zip(means, weights, strict=True))
    return q, len(means) - 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", type=Path)
    ap.add_argument("--out", type=Path, default=RESULTS / "replay_window_spread.json")
    args = ap.parse_args()
    files = args.files or RUNS
    out: dict[str, Any] = {"files": [str(p) for p in files], "versions": {}}
    for version in ("copy", "variant"):
        q_sum, df_sum, runs, windows = 0.0, 0, 0, 0
        for path in files:
            for run in json.loads(path.read_text())["seeds"]:
                q, df = q_of(run[version]["windows"])
                q_sum, df_sum, runs, windows = q_sum + q, df_sum + df, runs + 1, windows + df + 1
        p = float(stats.chi2.sf(q_sum, df_sum)) if df_sum else float("nan")
        out["versions"][version] = {"runs": runs, "windows": windows, "q": q_sum, "df": df_sum,
                                    "p": p}  # fmt: skip
        print(f"{version:8s} runs {runs:3d}  windows {windows:3d}  Q {q_sum:7.1f}  df {df_sum:3d}"
              f"  p {p:.3g}")  # fmt: skip
    args.out.write_text(json.dumps(out, indent=1))
    print(args.out)


if __name__ == "__main__":
    main()
