"""The version a real-path run promoted, on held-out seeds of `shift`: does it beat the frozen
champion (5% mean JCT or 3 SLA points) and match `heft_history`, as `bench/online_shift.py`
asks of the in-process loop's?

The version is the shipped champion with its heads' constant shifts moved (what the
learner's search registers: `head_search.with_shifts`), given as `--moved mem=0.2`, or a
bundle folder (`--bundle`, e.g. the demo registry's `.dagsched/demo/cache/versions/2`);
with both, the script checks that the bundle is that move. Played as served
(deterministic) on `bench/online_shift.py`'s held-out seeds, in its two regimes: from an
empty cluster (`--workflows`) and at steady state (the arrivals after `--steady-warmup` of
`--steady-workflows`). Each (policy, seed, regime) runs in its own process, over the
cores.

    .venv/bin/python experiments/realpath_held_out.py --moved mem=0.2
        [--bundle DIR] [--seeds 3] [--workflows 200] [--steady-workflows 600]
        [--steady-warmup 400] [--out experiments/results/realpath_held_out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

# the shared bench harness (and bench/online_shift.py) import as top-level modules
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from online_shift import CHAMPION, HELD_OUT_SEED, held_out, held_out_targets
from rich.console import Console
from rich.table import Table

from dagsched.learner.head_search import with_shifts
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.settings import load_settings

RESULTS = Path(__file__).resolve().parent / "results"


def promoted(moved: dict[str, float], bundle: Path | None) -> GNNScheduler:
    """The promoted version: `moved` on the shipped champion, checked against `bundle`."""
    champion = load_bundle(CHAMPION, "v1")
    built = GNNScheduler(with_shifts(champion.model, moved), champion.normalizer, "promoted")
    if bundle is not None:
        got = load_bundle(bundle, "promoted")
        ours, theirs = built.model.state_dict(), got.model.state_dict()
        same = ours.keys() == theirs.keys() and all(
            torch.allclose(ours[k], theirs[k], atol=1e-6) for k in ours
        )
        if not same:
            raise SystemExit(f"{bundle} is not the shipped champion moved by {moved}")
    return built


def one(name: str, moved: dict[str, float], seed: int, n: int, warmup: int) -> dict[str, float]:
    """One policy on one held-out seed in one regime (run in a worker process)."""
    torch.set_num_threads(1)
    sc = load_settings(profile="shift").sim
    pol: GNNScheduler | str
    if name == "heft_history":
        pol = name
    elif name == "frozen":
        pol = load_bundle(CHAMPION, "v1")
    else:
        pol = promoted(moved, None)
    return held_out(sc, {name: pol}, [seed], n, warmup)[name]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--moved", required=True, help="the heads' shifts, e.g. mem=0.2,cpu=-0.1")
    ap.add_argument("--bundle", type=Path, default=None)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workflows", type=int, default=200)
    ap.add_argument("--steady-workflows", type=int, default=600)
    ap.add_argument("--steady-warmup", type=int, default=400)
    ap.add_argument("--out", type=Path, default=RESULTS / "realpath_held_out.json")
    args = ap.parse_args()
    moved = {k: float(v) for k, v in (kv.split("=") for kv in args.moved.split(","))}
    promoted(moved, args.bundle)  # fails early on a bundle that is not the move
    seeds = [HELD_OUT_SEED + i for i in range(args.seeds)]
    regimes = {"held_out": (args.workflows, 0),
               "held_out_steady": (args.steady_workflows, args.steady_warmup)}  # fmt: skip
    names = ("promoted", "frozen", "heft_history")
    jobs = [(r, name, s) for r in regimes for name in names for s in seeds]
    with ProcessPoolExecutor() as pool:
        futures = {job: pool.submit(one, job[1], moved, job[2], *regimes[job[0]]) for job in jobs}
        got = {job: f.result() for job, f in futures.items()}
    doc: dict[str, Any] = {"moved": moved, "seeds": seeds, "bundle": str(args.bundle or "")}
    console = Console()
    for r, (n, warmup) in regimes.items():
        rows = {}
        for name in names:
            per = [got[(r, name, s)] for s in seeds]
            rows[name] = {m: sum(p[m] for p in per) / len(per) for m in per[0]}
        doc[r] = {**rows, "workflows": n, "warmup": warmup, "targets": held_out_targets(rows)}
        table = Table(
            title=f"{r}: {n} workflows" + (f", after the first {warmup}" if warmup else "")
        )
        for col in ("policy", "mean JCT (s)", "SLA", "OOM kills"):
            table.add_column(col, justify="right")
        for name, row in rows.items():
            table.add_row(name, f"{row['mean_jct_s']:,.1f}", f"{row['sla']:.3f}",
                          f"{row['oom_kills']:.1f}")  # fmt: skip
        console.print(table)
        console.print(doc[r]["targets"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
