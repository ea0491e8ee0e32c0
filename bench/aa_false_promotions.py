"""False promotions of the sequential A/B test: A/A runs (challenger identical to champion)
with the default decision rule, the default 10% challenger share and a verdict checked every
10 challenger workflows, until the test decides (budget included). Also the power against
a clearly better challenger. A pure simulation of per-workflow outcomes (SLA Bernoulli,
reward and speed normal), so it is cheap; the rule is `dagsched.learner.sequential` itself.

    .venv/bin/python bench/aa_false_promotions.py [--runs 200] [--share 0.1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
from harness.results import write_results
from rich.console import Console
from rich.table import Table

from dagsched.learner.live_ab import rule_from
from dagsched.learner.sequential import ABTest, DecisionRule
from dagsched.service_config import EvaluatorSettings

BASE_SLA, BASE_REWARD, REWARD_SD = 0.8, -0.5, 0.2
BASE_SPEED, SPEED_SD = 0.6, 0.4  # -log(JCT / deadline), as the frozen champion's


def one_run(seed: int, rule: DecisionRule, share: float, sla_c: float) -> tuple[str, int]:
    """(decision, challenger workflows seen) for one simulated A/B test."""
    rng = np.random.default_rng(seed)
    test = ABTest(rule)
    n_c = 0
    while True:
        challenger = rng.random() < share
        p = sla_c if challenger else BASE_SLA
        test.add(
            "challenger" if challenger else "champion",
            float(rng.random() < p),
            float(rng.normal(BASE_REWARD, REWARD_SD)),
            float(rng.normal(BASE_SPEED, SPEED_SD)),
        )
        if challenger:
            n_c += 1
            if n_c % 10 == 0:
                v = test.verdict()
                if v.decision != "continue":
                    return v.decision, n_c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--power-runs", type=int, default=50)
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=Path("bench/results/aa_false_promotions.json"))
    args = ap.parse_args()
    rule = rule_from(EvaluatorSettings())
    rows = []
    for name, sla_c, runs in (
        ("A/A (identical)", BASE_SLA, args.runs),
        ("clearly better (+0.10 SLA)", BASE_SLA + 0.10, args.power_runs),
        ("slightly worse (-0.05 SLA)", BASE_SLA - 0.05, args.power_runs),
    ):
        t0 = time.perf_counter()
        res = [one_run(seed, rule, args.share, sla_c) for seed in range(runs)]
        promoted = sum(d == "promote" for d, _ in res)
        rows.append(
            {
                "case": name,
                "runs": runs,
                "promoted": promoted,
                "promote_rate": promoted / runs,
                "retired": runs - promoted,
                "mean_challenger_workflows": float(np.mean([n for _, n in res])),
                "wall_s": round(time.perf_counter() - t0, 2),
            }
        )
    table = Table(title=f"sequential test, challenger share {args.share:g}")
    for col in ("case", "runs", "promote_rate", "mean_challenger_workflows"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            r["case"],
            str(r["runs"]),
            f"{r['promote_rate']:.3f}",
            f"{r['mean_challenger_workflows']:.0f}",
        )
    Console().print(table)
    Console().print(rule.describe())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"rule": rule.describe(), "share": args.share, "rows": rows}
    write_results(args.out, doc)


if __name__ == "__main__":
    main()
