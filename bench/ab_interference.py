"""What a per-workflow A/B test on a shared cluster can see of a change that helps the whole
cluster: the champion against a variant (its CPU reservation moved by `--shift` in the
continuous head's logit space; -0.4 packs tighter), in the `shift` profile's world without
its families' releases (`--release-every 0`, the default: with releases every 200 the
tighter CPU reservation no longer pays on the whole cluster).

Per seed, one workload of `bench/online_shift.py` (shift at `--shift-at` of the arrivals) is
played three times in the simulator (`SimLoop`, no learning):

- the champion serving every workflow (whole cluster A);
- the variant serving every workflow (whole cluster B);
- the live A/B: `--share` of the workflows (by the daemon's hash) to the variant, the rest to
  the champion, on the one cluster, as the daemon serves a challenger.

The whole-cluster difference is what the variant would change if promoted; the A/B's
difference (the evaluator's regression-adjusted sequential test, fed every finished workflow
in finishing order, with its confidence sequence at the end) is what the judge sees. When the
variant's gain is congestion it relieves, the champion's workflows in the A/B enjoy it too,
and the test sees a fraction of it (docs/concepts/learning.md, "What has been measured").

    .venv/bin/python bench/ab_interference.py [--quick] [--json] [--seeds 2]
        [--workflows 2000] [--shift -0.4] [--head cpu] [--share 0.5] [--out DIR]

Writes ab_interference.json and ab_interference.png under --out (default bench/results).
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from online_shift import CHAMPION, interference_world_arg, shift_time, workload
from rich.console import Console
from rich.table import Table

from dagsched.learner.live_ab import Sample
from dagsched.learner.sequential import ABTest, DecisionRule
from dagsched.learner.sim_loop import LoopConfig, SimLoop
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig

ARMS = ("champion", "challenger")
HEADS = {"cpu": 0, "mem": 1, "retries": 2}  # continuous head rows: (mean shift, concentration)


def variant(sched: GNNScheduler, head: str, shift: float) -> GNNScheduler:
    """`sched` with one reservation's mean moved by `shift` in logit space."""
    model = copy.deepcopy(sched.model)
    with torch.no_grad():
        model.cont_head[-1].bias[2 * HEADS[head]] += shift
    return GNNScheduler(model, sched.normalizer, "v2")


def play(
    sc: ScenarioConfig, seed: int, n: int, champion: GNNScheduler, challenger: GNNScheduler | None,
    share: float,
) -> list[Sample]:  # fmt: skip
    """Every finished workflow's sample (as the judge sees it), in finishing order."""
    loop = SimLoop(champion, LoopConfig(learn=False, share=share), seed=seed)
    if challenger is not None:
        loop.versions[challenger.version] = challenger
        loop.parent[challenger.version] = champion.version
        loop.challenger = challenger.version
    loop.run(loop.simulator(sc, workload(sc, seed, n), seed))
    return loop.samples


def whole(samples: list[Sample]) -> dict[str, float]:
    return {
        "workflows": len(samples),
        "sla": float(np.mean([s.sla for s in samples])),
        "speed": float(np.mean([s.speed for s in samples])),
    }


def judged(samples: list[Sample]) -> dict[str, Any]:
    """The test's statistics after every workflow (no budget: where it ends up)."""
    test = ABTest(DecisionRule(min_samples=2, max_samples=10**9))
    first = None
    n_c = 0
    for s in samples:
        test.add(s.arm, s.sla, s.reward, s.speed, s.covariates)
        n_c += s.arm == "challenger"
        if s.arm == "challenger" and n_c % 10 == 0 and n_c >= 100 and first is None:
            v = test.verdict()
            if v.decision != "continue":
                first = {"decision": v.decision, "challenger_workflows": n_c, "reason": v.reason}
    v = test.verdict()
    return {
        "first_verdict": first,
        **{m: {"diff": st.diff, "lower": st.lower, "upper": st.upper} for m, st in v.stats.items()},
        "explained_speed": v.stats["speed"].explained,
    }


def plot(doc: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, metric, label in (
        (axes[0], "speed", "speed (-log JCT/deadline)"),
        (axes[1], "sla", "SLA"),
    ):
        for i, r in enumerate(doc["seeds"]):
            w = r["whole_variant"][metric] - r["whole_champion"][metric]
            ab = r["ab"][metric]
            ax.bar(i - 0.18, w, 0.36, color="tab:blue", label="whole cluster" if i == 0 else None)
            ax.bar(i + 0.18, ab["diff"], 0.36, color="tab:orange", label="A/B" if i == 0 else None)
            err = [[ab["diff"] - ab["lower"]], [ab["upper"] - ab["diff"]]]
            ax.errorbar(i + 0.18, ab["diff"], yerr=err, color="k", capsize=4)
        ax.axhline(0, color="gray", lw=0.8)
        ax.set_xticks(range(len(doc["seeds"])), [f"seed {r['seed']}" for r in doc["seeds"]])
        ax.set_ylabel(f"variant - champion, {label}")
        ax.legend()
    cfg = doc["config"]
    fig.suptitle(
        f"{cfg['head']} {cfg['shift']:+g} logit: whole-cluster effect vs what a "
        f"{cfg['share']:.0%} A/B sees (bars: 95% confidence sequence)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 seed x 1,000 workflows")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--workflows", type=int, default=2000)
    ap.add_argument("--shift-at", type=float, default=0.1)
    interference_world_arg(ap)
    ap.add_argument("--head", choices=sorted(HEADS), default="cpu")
    ap.add_argument("--shift", type=float, default=-0.4)
    ap.add_argument("--share", type=float, default=0.5)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args()
    if args.quick:
        args.seeds, args.workflows = 1, 1000
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    champion = load_bundle(CHAMPION, "v1")
    other = variant(champion, args.head, args.shift)
    rows = []
    for seed in range(args.seeds):
        base = replace(
            s.sim, workload=replace(s.sim.workload, workflows=args.workflows), shift=None
        )
        at = shift_time(base, seed, args.workflows, args.shift_at)
        sc = replace(base, shift=replace(s.sim.shift, at_s=at, release_every=args.release_every))
        a = play(sc, seed, args.workflows, champion, None, 0.0)
        b = play(sc, seed, args.workflows, other, None, 0.0)
        ab = play(sc, seed, args.workflows, champion, other, args.share)
        rows.append(
            {
                "seed": seed,
                "whole_champion": whole(a),
                "whole_variant": whole(b),
                "ab_arms": {a: whole([x for x in ab if x.arm == a]) for a in ARMS},
                "ab": judged(ab),
            }
        )  # fmt: skip
    doc = {"config": vars(args) | {"out": str(args.out)}, "seeds": rows}
    doc["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab_interference.json").write_text(json.dumps(to_jsonable(doc), indent=1))
    plot(doc, args.out / "ab_interference.png")
    if args.json:
        print(json.dumps(to_jsonable(doc)))
        return
    t = Table(title=f"{args.head} {args.shift:+g}: whole cluster vs a {args.share:.0%} A/B")
    for col in (
        "seed",
        "speed whole",
        "speed A/B [95% CS]",
        "SLA whole",
        "SLA A/B [95% CS]",
        "first verdict",
    ):
        t.add_column(col, justify="right")
    for r in rows:
        ab = r["ab"]
        fv = ab["first_verdict"]
        cs = {
            m: f"{ab[m]['diff']:+.3f} [{ab[m]['lower']:+.3f}, {ab[m]['upper']:+.3f}]"
            for m in ("sla", "speed")
        }
        t.add_row(
            str(r["seed"]),
            f"{r['whole_variant']['speed'] - r['whole_champion']['speed']:+.3f}",
            cs["speed"],
            f"{r['whole_variant']['sla'] - r['whole_champion']['sla']:+.3f}",
            cs["sla"],
            "none" if fv is None else f"{fv['decision']} at {fv['challenger_workflows']}",
        )  # fmt: skip
    Console().print(t)
    print(f"wall {doc['wall_s']} s; {args.out / 'ab_interference.png'}")


if __name__ == "__main__":
    main()
