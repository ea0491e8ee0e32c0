"""The `dagsched explain --sample` report: Markdown, JSON and one chart per model version.

`write_report` turns the mean attributions per version (computed by the command) into
`explain.md` and `explain.json`, with the share of each feature group in the chosen node's
logit and, where the champion changed within the sample, a before/after comparison.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dagsched.schemas.messages import DecisionLogMsg

SUMMARY_TARGETS = ("logit_chosen", "logit_gap", "cpu", "mem", "max_retries")


def _champion_versions(logs: Sequence[DecisionLogMsg]) -> list[str]:
    """Versions the champion arm used, oldest first (by their latest decision)."""
    last: dict[str, float] = {}
    for log in logs:
        if log.arm == "champion" and log.observation is not None:
            last[log.model_version] = max(last.get(log.model_version, 0.0), log.decided_at)
    return sorted(last, key=last.__getitem__)


def _safe(version: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", version)


def _shares(means: dict[str, float]) -> dict[str, float]:
    s = sum(means.values())
    return {k: (v / s if s > 0 else 0.0) for k, v in means.items()}


def write_report(
    out: Path,
    asked: int,
    stored: int,
    logs: Sequence[DecisionLogMsg],
    fallback: int,
    unreadable: int,
    sums: dict[str, dict[str, dict[str, float]]],
    counts: dict[str, int],
    arms: dict[str, dict[str, int]],
    errors: dict[str, str],
    incomplete: dict[str, int],
    max_err: dict[str, float],
    sources: dict[str, str],
    top: int,
) -> dict[str, Any]:
    """Write explain.md (and a chart per version) into `out`; return the JSON summary
    (also written as explain.json)."""
    from dagsched.cli.explain.charts import write_bars
    from dagsched.policy.explanation import BASELINE, METHOD, TOLERANCE_ABS, TOLERANCE_REL

    lines = ["# Why the scheduler decides what it decides", ""]
    span = ""
    if logs:
        t0 = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(min(x.decided_at for x in logs)))
        t1 = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(max(x.decided_at for x in logs)))
        span = f", decided {t0} - {t1} UTC"
    lines += [
        f"The {len(logs)} most recent of {stored} stored decision logs (asked for {asked})"
        f"{span}: "
        f"{sum(counts.values())} explained, {fallback} made by the heuristic fallback "
        f"(no model, no attributions), {unreadable} unreadable records skipped.",
        "",
        f"Method: {METHOD}; baseline: {BASELINE}. A feature's score is its mean |attribution| "
        "per decision, summed over the nodes (node features) or the DAG's tasks (DAG features) "
        "it appears in; *share* is that score over the sum of all scores. Targets: the chosen "
        "node's logit, the logit gap to the runner-up node, and the CPU, memory and retries "
        "values (Beta means at the chosen node, in their units). Completeness rule per target: "
        f"|sum(attr) - (f(x) - f(baseline))| <= max({TOLERANCE_ABS:g}, "
        f"{TOLERANCE_REL:g} x |f(x) - f(baseline)|).",
        "",
    ]
    charts: dict[str, str] = {}
    for version in sorted(sums, key=lambda v: -counts[v]):
        means = sums[version]
        chosen = means["logit_chosen"]
        share = _shares(chosen)
        arm_txt = ", ".join(f"{a} {k}" for a, k in sorted(arms[version].items()))
        lines += [
            f"## Model {version}",
            "",
            f"{counts[version]} decisions ({arm_txt}), model loaded from "
            f"{sources.get(version, '?')}; completeness held for "
            f"{counts[version] - incomplete.get(version, 0)} of {counts[version]} "
            f"(largest error {max_err.get(version, 0.0):.2g}).",
            "",
            "| feature | share (chosen logit) | chosen logit | logit gap | cpu | mem | retries |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for name in sorted(chosen, key=lambda x: -chosen[x])[:top]:
            cells = [f"{means[t].get(name, 0.0):.4f}" for t in SUMMARY_TARGETS]
            lines.append(f"| `{name}` | {share[name]:.1%} | " + " | ".join(cells) + " |")
        png = f"explain_{_safe(version)}.png"
        write_bars(
            out / png,
            f"model {version}: top features ({counts[version]} decisions)",
            {"chosen logit": chosen, "logit gap": means["logit_gap"]},
            top=min(top, 15),
        )
        charts[version] = png
        lines += ["", f"![top features of {version}]({png})", ""]
    for version, why in sorted(errors.items()):
        lines += [f"## Model {version}", "", f"Not explained: {why}", ""]

    comparison: dict[str, Any] | None = None
    champs = [v for v in _champion_versions(logs) if v in sums]
    lines += ["## After the last promotion", ""]
    if len(champs) >= 2:
        prev, cur = champs[-2], champs[-1]
        a, b = _shares(sums[prev]["logit_chosen"]), _shares(sums[cur]["logit_chosen"])
        names = sorted(set(a) | set(b), key=lambda x: -max(a.get(x, 0), b.get(x, 0)))[:top]
        rank_a = {x: i + 1 for i, x in enumerate(sorted(a, key=lambda x: -a[x]))}
        rank_b = {x: i + 1 for i, x in enumerate(sorted(b, key=lambda x: -b[x]))}
        lines += [
            f"The champion arm served {prev} and then {cur}. Shares of the chosen node's logit:",
            "",
            f"| feature | {prev} | {cur} | change | rank {prev} → {cur} |",
            "|---|---:|---:|---:|---:|",
        ]
        rows = []
        for x in names:
            d = b.get(x, 0.0) - a.get(x, 0.0)
            rows.append({"feature": x, "previous": a.get(x, 0.0), "current": b.get(x, 0.0)})
            lines.append(
                f"| `{x}` | {a.get(x, 0.0):.1%} | {b.get(x, 0.0):.1%} | {d * 100:+.1f} pp | "
                f"{rank_a.get(x, '-')} → {rank_b.get(x, '-')} |"
            )
        png = "explain_promotion.png"
        write_bars(
            out / png,
            f"share of the chosen logit: {prev} (before) vs {cur} (after)",
            {cur: b, prev: a},
            top=min(top, 15),
            xlabel="share of all |IG attribution| to the chosen node's logit",
        )
        lines += ["", f"![before and after the promotion]({png})", ""]
        comparison = {"previous": prev, "current": cur, "features": rows, "png": png}
    else:
        lines += [
            "Fewer than two model versions served the champion arm among these decisions: "
            "nothing to compare yet.",
            "",
        ]
    (out / "explain.md").write_text("\n".join(lines))
    report = {
        "asked": asked,
        "stored": stored,
        "decisions": len(logs),
        "fallback": fallback,
        "unreadable": unreadable,
        "versions": {
            v: {
                "decisions": counts[v],
                "arms": dict(arms[v]),
                "incomplete": incomplete.get(v, 0),
                "max_error": max_err.get(v, 0.0),
                "mean_abs_attribution": sums[v],
                "png": charts[v],
                "source": sources.get(v),
            }
            for v in sums
        },
        "not_explained": errors,
        "promotion": comparison,
        "report": str(out / "explain.md"),
    }
    (out / "explain.json").write_text(json.dumps(_finite(report), indent=2) + "\n")
    return _finite(report)


def _finite(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x
