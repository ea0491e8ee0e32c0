"""The table of a policy study (`experiments/policy_study.sh`): per try, its training and the
held-out result against heft_history_srpt (the base) at loads 0.8 and 0.95; and, where a try
was also evaluated on 10 seeds (`OUT/<try>.eval10.json`, the rows of `dagsched eval --json
--seeds 10 --workflows 200 --loads 0.5,0.8,0.95`), that result against the base's on the
same seeds (the `srpt` rows of `experiments/heuristic_landscape.py`'s JSON, `--base`).

    .venv/bin/python experiments/policy_study.py OUT [--markdown FILE]
        [--base experiments/results/heuristic_landscape.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TRIES = {  # label: what the try changes from input_all
    "input_all": "input-driven baselines, every residual",
    "gae_all": "critic and GAE instead (3 critic burn-in updates)",
    "input_priority": "the priority residual alone",
    "input_reservations": "the CPU and memory residuals alone",
    "input_kl": "KL to the base: coefficient 0.01, budget 1.0",
    "input_all_long": "input_all resumed for 36 more updates (48 in all)",
}


def rows(out: Path) -> list[dict[str, Any]]:
    found = []
    for label, what in TRIES.items():
        path = out / f"{label}.json"
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        by = {s["scenario"]: s for s in doc["summary"]}
        kl = doc.get("curve", {}).get("losses/approx_kl", [])
        found.append(
            {
                "try": label,
                "what": what,
                "updates": doc.get("updates"),
                "train_min": round(doc.get("train_s", 0) / 60, 1),
                "approx_kl_last": kl[-1] if kl else None,
                **{
                    f"{k}@{sc.split(':')[1]}": by[sc][k]
                    for sc in ("load:0.8", "load:0.95")
                    if sc in by
                    for k in ("jct_vs_hh", "model_sla", "hh_sla", "cost_vs_hh")
                },
            }
        )
    return found


def ten_seeds(out: Path, base_json: Path) -> list[dict[str, Any]]:
    """Per try evaluated on 10 seeds: JCT, SLA and reserved core-seconds against the base."""
    if not base_json.exists():
        return []
    base = {
        f"load:{r['load']}": r
        for r in json.loads(base_json.read_text())["rows"]
        if r["variant"] == "srpt"
    }
    found = []
    for label, what in TRIES.items():
        path = out / f"{label}.eval10.json"
        if not path.exists():
            continue
        by = {r["scenario"]: r for r in json.loads(path.read_text())}
        row: dict[str, Any] = {"try": label, "what": what}
        for sc, r in by.items():
            b = base[sc]
            row[f"jct_vs_base@{sc[5:]}"] = r["mean_jct_s"] / b["mean_jct_s"] - 1
            row[f"sla@{sc[5:]}"] = r["sla_attainment"]
            row[f"base_sla@{sc[5:]}"] = b["sla_attainment"]
            row[f"cost_vs_base@{sc[5:]}"] = r["cost_core_s"] / b["cost_core_s"] - 1
        found.append(row)
    return found


def markdown_ten(found: list[dict[str, Any]]) -> str:
    head = (
        "| try | what | JCT vs base @0.5 / 0.8 / 0.95 | SLA @0.95 (base) "
        "| reserved core-s vs base @0.95 |\n|---|---|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r['try']} | {r['what']} | {r['jct_vs_base@0.5']:+.1%} / "
        f"{r['jct_vs_base@0.8']:+.1%} / {r['jct_vs_base@0.95']:+.1%} | "
        f"{r['sla@0.95']:.3f} ({r['base_sla@0.95']:.3f}) | {r['cost_vs_base@0.95']:+.1%} |\n"
        for r in found
    )
    return head + body


def markdown(found: list[dict[str, Any]]) -> str:
    head = (
        "| try | what | updates | JCT vs base @0.8 | SLA @0.8 (base) | JCT vs base @0.95 "
        "| SLA @0.95 (base) | reserved core-s vs base @0.95 |\n"
        "|---|---|---:|---:|---:|---:|---:|---:|\n"
    )
    body = "".join(
        f"| {r['try']} | {r['what']} | {r['updates']} | {r['jct_vs_hh@0.8']:+.1%} | "
        f"{r['model_sla@0.8']:.3f} ({r['hh_sla@0.8']:.3f}) | {r['jct_vs_hh@0.95']:+.1%} | "
        f"{r['model_sla@0.95']:.3f} ({r['hh_sla@0.95']:.3f}) | {r['cost_vs_hh@0.95']:+.1%} |\n"
        for r in found
    )
    return head + body


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument(
        "--base", type=Path, default=Path("experiments/results/heuristic_landscape.json")
    )
    args = ap.parse_args()
    found = rows(args.out)
    ten = ten_seeds(args.out, args.base)
    text = markdown(found) + ("\n10 held-out seeds:\n\n" + markdown_ten(ten) if ten else "")
    print(text)
    doc = {"study": found, "ten_seeds": ten}
    (args.out / "study.json").write_text(json.dumps(doc, indent=1) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(text)


if __name__ == "__main__":
    main()
