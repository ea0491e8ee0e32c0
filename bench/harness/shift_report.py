"""Per-arm series, plot and table of `bench/online_shift.py`.

Series are bucketed by arrival order (every `width` workflows of a run, seeds pooled), so
the x axis reads as "workflows served" and the shift falls in the same place for every seed.
A workflow's SLA is met when it finished by its deadline; mean JCT is over finished ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dagsched.learner.sim_loop import WorkflowResult

COLORS = {"frozen": "tab:gray", "loop": "tab:blue", "heft_history": "tab:orange"}


def _stats(ws: Sequence[WorkflowResult]) -> dict[str, Any]:
    done = [w.end_s - w.arrival_s for w in ws if w.end_s is not None and not w.failed]
    return {
        "n": len(ws),
        "sla": sum(w.met for w in ws) / len(ws) if ws else None,
        "mean_jct_s": sum(done) / len(done) if done else None,
        "failed": sum(w.failed for w in ws),
    }


def summarize_arm(
    runs: Sequence[Sequence[WorkflowResult]], shift_at: dict[int, float], width: int
) -> dict[str, Any]:
    """Before/after the shift (by arrival) and per bucket of `width` arrivals, seeds pooled.
    `runs` are in the order of `shift_at`'s seeds (a run may start at any seed)."""
    before: list[WorkflowResult] = []
    after: list[WorkflowResult] = []
    buckets: dict[int, list[WorkflowResult]] = {}
    for seed, res in zip(shift_at, runs, strict=True):
        for i, w in enumerate(res):
            (after if w.arrival_s >= shift_at[seed] else before).append(w)
            buckets.setdefault(i // width, []).append(w)
    series = [{"start": b * width, **_stats(ws)} for b, ws in sorted(buckets.items())]
    return {"before": _stats(before), "after": _stats(after), "series": series}


def plot(path: Path, per_arm: dict[str, Any], events: list[dict], doc: dict) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cfg = doc["config"]
    width = cfg["bucket_workflows"]
    fig = Figure(figsize=(10, 7), layout="constrained")
    FigureCanvasAgg(fig)
    ax_sla, ax_jct = fig.subplots(2, 1, sharex=True)
    for arm, d in per_arm.items():
        pts = [(b["start"] + width / 2, b["sla"], b["mean_jct_s"]) for b in d["series"]]
        ax_sla.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3,
                    color=COLORS.get(arm), label=arm)  # fmt: skip
        ax_jct.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", ms=3,
                    color=COLORS.get(arm), label=arm)  # fmt: skip
    at = cfg["shift_at"] * cfg["workflows"]
    for ax in (ax_sla, ax_jct):
        ax.axvline(at, color="tab:red", ls="--", label="shift on")
        ax.grid(alpha=0.3)
    marks = {"promote": ("^", "tab:green"), "rollback": ("v", "tab:red"), "retire": ("x", "k")}
    for kind, (m, c) in marks.items():
        xs = [e["arrived"] for e in events if e["kind"] == kind]
        if xs:
            ax_sla.scatter(
                xs, [0.02] * len(xs), marker=m, color=c, s=40, label=f"{kind} (any seed)"
            )
    rounds = [e["arrived"] for e in events if e["kind"] == "round"]
    if rounds:
        ax_sla.scatter(rounds, [-0.01] * len(rounds), marker="|", color="tab:blue", s=60,
                       label="learner round (any seed)")  # fmt: skip
    ax_sla.set_ylim(-0.04, 1.05)
    ax_sla.set_ylabel(f"SLA attainment (per {width} arrivals)")
    ax_jct.set_ylabel("mean JCT s (finished)")
    ax_jct.set_xlabel("workflows arrived (seeds pooled)")
    sh = cfg["shift"]
    ax_sla.set_title(
        f"shift: OOM restart {sh['oom_restart_s']:g} s, memory spread x{sh['mem_spread']:g}, "
        f"neighbours {sh['neighbour_slowdown']:g}; {cfg['seeds']} seed(s), share "
        f"{cfg['share']:g}, every {cfg['every_n']} attempts"
    )
    ax_sla.legend(loc="lower left", fontsize=8, ncol=2)
    fig.savefig(path, dpi=110)


def table(doc: dict) -> None:
    s, arms = doc["summary"], doc["arms"]

    def f(x: float | None, fmt: str = ".3f") -> str:
        return "-" if x is None else format(x, fmt)

    t = Table(
        title=f"online shift, {doc['config']['seeds']} seed(s) x {doc['config']['workflows']}"
    )
    for col in ("", *arms):
        t.add_column(col, justify="right" if col else "left")
    for period in ("before", "after"):
        t.add_row(f"SLA {period} the shift", *(f(arms[a][period]["sla"]) for a in arms))
        t.add_row(f"mean JCT s {period}", *(f(arms[a][period]["mean_jct_s"], ".0f") for a in arms))
    for key, label in (("held_out", "held-out"), ("held_out_steady", "steady held-out")):
        if key not in s:
            continue
        ho = s[key]
        held = [ho["frozen"], ho["promoted"], ho["heft_history"]]
        t.add_row(f"{label} SLA (loop: promoted)", *(f(h["sla"]) for h in held))
        t.add_row(f"{label} mean JCT s", *(f(h["mean_jct_s"], ".0f") for h in held))
    ho = s["held_out"]
    if ho.get("latest", {}).get("sla") is not None:
        late = ho["latest"]
        t.add_row("held-out, learner's last version", "", f(late["sla"]), "")
        t.add_row("  its mean JCT s", "", f(late["mean_jct_s"], ".0f"), "")
    c = Console()
    c.print(t)
    c.print(
        f"rounds {s['rounds']}, promotions {s['promotions']}, rollbacks {s['rollbacks']}, "
        f"workflows to first promotion per seed {s['workflows_to_promotion']}, "
        f"A/A false promotions {s['aa_false_promotion_rate']:.3f}; {s['wall_s']:.0f} s"
    )
    if "replay_verdicts" in s:
        fe = s["replay_fidelity_jct_err"]
        med = "-" if fe["median"] is None else f"{fe['median']:.1%}"
        top = "-" if fe["max"] is None else f"{fe['max']:.1%}"
        c.print(
            f"replay judge: windows {s['replay_verdicts']}; fidelity (mean JCT error) "
            f"median {med}, max {top}, {fe['over_limit']} of {fe['windows']} over {fe['limit']:.0%}"
        )
        if fe.get("own_after_shift_max") is not None:
            c.print(
                f"  each window alone, after the shift: median {fe['own_after_shift_median']:.1%}, "
                f"max {fe['own_after_shift_max']:.1%}, {fe['own_over_limit']} over the limit"
            )
    if s.get("promoted_shifts"):
        c.print(f"promoted shifts per seed (logit): {s['promoted_shifts']}")
    c.print(f"targets: {s['targets']}")
