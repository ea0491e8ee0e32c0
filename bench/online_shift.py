"""Learning while serving in the shifted world: the loop against the frozen champion and
heft_history, then the promoted version on held-out seeds, and A/A on the faithful world.

Per seed, one workload of the `shift` profile's scenario (32 nodes, load 0.6, faults on) is
played in the simulator three times, with the profile's shift (`sim.shift`) switched on,
unannounced, when the workflow at `--shift-at` of the run arrives: served by the frozen
shipped champion, by the learning loop (`dagsched.learner.sim_loop.SimLoop`: the daemon's
champion/challenger split, `finetune_heads` on the actor heads, the evaluator's judge and
guardrail) starting from that champion, and by `heft_history`. Every run plays to its end,
so every workflow's outcome is known.

The judge is the evaluator's (`--judge`, default the settings' `evaluator.judge`): with
`replay`, every closed window of the loop's run is replayed for the pair under test
(`ReplayGate` over the recorded run) and a replay win promotes once the challenger's live
slice, the canary, is clean; `replay_verdicts` counts the windows' decisions and
`replay_fidelity_jct_err` is how far the serving version's replays were from the mean JCT
of what it served. With `ab`, the per-workflow A/B promotes, as before.

Then, held out: each seed's final loop champion (the promoted version, or the shipped one
when nothing was promoted), the frozen champion and heft_history on `--held-out` fresh seeds
of the shifted world (shift from t=0), as served (deterministic), in two regimes:
`held_out`, `--held-out-workflows` from an empty cluster and an empty history (where early
OOM kills weigh most), and `held_out_steady`, the arrivals after the first
`--steady-warmup` of `--steady-workflows` (what the judge's windows look like).

A/A (`aa_false_promotion_rate`): the A/A logic of `bench/aa_false_promotions.py` (a
challenger identical to the champion; verdict every 10 challenger workflows until the test
decides) with the loop's share and decision rule, fed with real per-workflow outcomes (SLA,
mean reward, speed) of the frozen champion in the faithful, unshifted world, drawn at random.

    .venv/bin/python bench/online_shift.py [--quick] [--json] [--seeds 3] [--first-seed 0]
        [--workflows 2000] [--held-out 3] [--held-out-workflows 200]
        [--steady-workflows 600] [--steady-warmup 400]
        [--shift-at 0.1] [--share 0.3] [--explore-share 0.4] [--every-n 2000] [--window 2000]
        [--lr 2e-3] [--epochs 8] [--target-kl 0.2] [--ent-coef 0.01] [--clip 0.2]
        [--credit task-critic] [--min-samples 100] [--max-samples 300]
        [--replace-challenger] [--no-keep-learning] [--load L] [--judge replay|ab]
        [--learner ppo|search] [--out DIR]

The PPO defaults are an exploration slice to learn from, rounds every ~90 workflows that go
on improving a shadow while a challenger is under test (`--keep-learning`), and a
challenger budget so a futile test ends (docs/concepts/world.md). `--learner search` makes
each round a search of the heads' shifts by paired replay of the judge's newest recorded
windows (`learner.head_search`): no exploration slice, no shadow.

`held_out.latest` is each seed's last learner version on the held-out seeds, promoted or
not: whether the learner found anything, apart from the judge.

Writes online_shift.json and online_shift.png under --out (default bench/results).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness.finetune_args import add_finetune_args, finetune_config
from harness.shift_report import plot, summarize_arm, table
from tqdm import tqdm

from dagsched.core.workflow import Workflow
from dagsched.learner.live_ab import Sample, rule_from
from dagsched.learner.sequential import ABTest, DecisionRule
from dagsched.learner.sim_loop import LoopConfig, LoopEvent, SimLoop, WorkflowResult
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.reporting import to_jsonable
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig, ShiftConfig
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import make_policy, steady_state, stream_workflows
from dagsched.sim.snapshot import SchedulerPolicy

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"
ARMS = ("frozen", "loop", "heft_history")
HELD_OUT_SEED = 20_000
AA_SEED = 30_000


def workload(sc: ScenarioConfig, seed: int, n: int) -> Iterator[Workflow]:
    return stream_workflows(sc, seed, n)


def interference_world_arg(ap: argparse.ArgumentParser) -> None:
    """`--release-every` of the interference benches: their world is the shift without the
    families' releases unless told otherwise (it is where the interference case was found;
    with releases every 200 the tighter CPU reservation is worth more)."""
    ap.add_argument(
        "--release-every",
        type=float,
        default=0.0,
        help="families ship a release every this many of their workflows (the shift profile: "
        "200); 0, the default, is the interference case's world",
    )


def shift_time(sc: ScenarioConfig, seed: int, n: int, at: float) -> float:
    """Arrival time of the workflow at share `at` of the run."""
    k = min(n - 1, int(at * n))
    return next(itertools.islice(workload(sc, seed, n), k, None)).arrival_s


def play_loop(
    sc: ScenarioConfig, seed: int, n: int, cfg: LoopConfig, desc: str | None = None
) -> tuple[list[WorkflowResult], SimLoop]:
    """The loop's run of one seed; with `desc`, a progress bar of ended workflows."""
    loop = SimLoop(load_bundle(CHAMPION, "v1"), cfg, seed=seed)
    every = 0.1 if sys.stderr.isatty() else 60.0  # a redirected log gets a line a minute
    told = [0, 0]  # events and judged windows written so far

    def progress(bar: tqdm, ended: int) -> None:
        bar.update(ended - bar.n)
        if desc is None:
            return
        # a line per event and judged window as they happen: a long run tells its story as it
        # goes, and a run stopped early has told what it got to
        for e in loop.events[told[0] :]:
            shifts = ", ".join(
                f"{k.removeprefix('search/shift_')} {v:+.2f}"
                for k, v in e.detail.items()
                if k.startswith("search/shift_")
            )
            windows = ",".join(map(str, e.detail.get("windows", [])))
            note = shifts or e.detail.get("reason", "") or ("no move" if e.kind == "search" else "")
            if windows:
                note = f"{note} (windows {windows})"
            bar.write(f"{desc}: workflow {ended}: {e.kind} {e.version} {note}".rstrip())
        for w in loop.windows[told[1] :]:
            gain = w["gain"].get("jct")
            who = (
                f"{w['challenger']} vs {w['champion']}"
                if w["challenger"] is not None
                else f"{w['champion']} alone"
            )
            bar.write(
                f"{desc}: workflow {ended}: window {w['window']} {who}: {w['decision']}, "
                + ("fidelity n/a" if w["jct_err"] is None else f"fidelity {w['jct_err']:.1%}")
                + ("" if gain is None else f", replayed JCT {gain:+.1%}")
            )
        told[:] = [len(loop.events), len(loop.windows)]

    with tqdm(
        total=n, desc=desc, unit="wf", disable=desc is None, file=sys.stderr, mininterval=every
    ) as bar:
        results = loop.run(
            loop.simulator(sc, workload(sc, seed, n), seed),
            progress=lambda k: progress(bar, k),
        )
    return results, loop


def play_policy(sc: ScenarioConfig, seed: int, n: int, name: str) -> list[WorkflowResult]:
    """Every workflow's result under a baseline policy (the loop's bookkeeping, no learning)."""
    sim = Simulator(sc, workload(sc, seed, n), seed=seed)
    res: dict[str, WorkflowResult] = {}

    def hook(t: Any, o: Any, _r: float) -> None:
        wf = t.run.wf
        w = res.get(wf.id)
        if w is None:
            w = res[wf.id] = WorkflowResult(
                wf.id, wf.arrival_s, wf.arrival_s + wf.deadline_s, name, name
            )
        if w.end_s is not None:
            return
        wf_failed = o.failed and t.failures + 1 > t.max_retries
        if wf_failed or (not o.failed and t.run.remaining == 1):
            w.end_s, w.failed = sim.now, wf_failed
            w.met = not wf_failed and sim.now <= w.due_s + 1e-9

    sim.on_outcome = hook
    sim.run(make_policy(name, seed))
    return sorted(res.values(), key=lambda w: w.arrival_s)


def held_out(
    sc: ScenarioConfig,
    scheds: dict[str, GNNScheduler | str],
    seeds: Sequence[int],
    n: int,
    warmup: int = 0,
) -> dict[str, dict[str, float]]:
    """SLA and mean JCT per name over `seeds`, `n` workflows each, shifted from t=0; with
    `warmup`, over the arrivals after the first `warmup` of each run only (steady state)."""
    wl = replace(sc.workload, workflows=n)
    sc0 = replace(sc, workload=wl, shift=replace(sc.shift or ShiftConfig(), at_s=0.0))
    out = {}
    for name, pol in scheds.items():
        p = pol if isinstance(pol, str) else SchedulerPolicy(pol)
        rows = [steady_state(sc0, p, seed=s, warmup=warmup) for s in seeds]
        out[name] = {
            "sla": float(np.mean([r["sla_attainment"] for r in rows])),
            "mean_jct_s": float(np.mean([r["mean_jct_s"] for r in rows])),
            "oom_kills": float(np.mean([r["oom_kills"] for r in rows])),
        }
    return out


def held_out_versions(
    sc: ScenarioConfig,
    versions: dict[str, dict[int, GNNScheduler]],
    seeds: Sequence[int],
    n: int,
    warmup: int = 0,
) -> dict[str, Any]:
    """`held_out` of the frozen champion, heft_history and, per name of `versions`, the mean
    over the loop seeds' versions of that name (None when no seed has one), with each
    seed's promoted version's as `promoted_per_seed`. A version met twice (the latest one is
    often the promoted one) is played once."""
    ho: dict[str, Any] = held_out(
        sc,
        {"frozen": load_bundle(CHAMPION, "v1"), "heft_history": "heft_history"},
        seeds,
        n,
        warmup,
    )
    played: dict[int, dict[str, float]] = {}

    def one(v: GNNScheduler) -> dict[str, float]:
        if id(v) not in played:
            played[id(v)] = held_out(sc, {"p": v}, seeds, n, warmup)["p"]
        return played[id(v)]

    for name, per_seed in versions.items():
        got = {k: one(v) for k, v in per_seed.items()}
        ho[name] = {
            m: float(np.mean([t[m] for t in got.values()])) if got else None
            for m in ("sla", "mean_jct_s", "oom_kills")
        }
        if name == "promoted":
            ho["promoted_per_seed"] = got
    return ho


def held_out_targets(ho: dict[str, Any]) -> dict[str, bool]:
    """The promoted version against the frozen champion (5% mean JCT or 3 SLA points) and
    against heft_history (no worse, within noise) in one held-out regime."""
    p, f, h = ho["promoted"], ho["frozen"], ho["heft_history"]
    return {
        "beats_frozen": p["sla"] is not None
        and (p["mean_jct_s"] <= 0.95 * f["mean_jct_s"] or p["sla"] >= f["sla"] + 0.03),
        "no_worse_than_heft_history": p["sla"] is not None
        and p["sla"] >= h["sla"] - 0.01
        and p["mean_jct_s"] <= 1.01 * h["mean_jct_s"],
    }


def aa_rate(
    samples: Sequence[Sample], rule: DecisionRule, share: float, runs: int
) -> dict[str, float]:
    """Share of A/A tests that promote, each fed with `samples` drawn at random."""
    promoted, seen = 0, []
    for seed in range(runs):
        rng = np.random.default_rng(AA_SEED + seed)
        test, n_c = ABTest(rule), 0
        while True:
            x = samples[int(rng.integers(len(samples)))]
            challenger = rng.random() < share
            arm = "challenger" if challenger else "champion"
            test.add(arm, x.sla, x.reward, x.speed, x.covariates)
            if challenger:
                n_c += 1
                if n_c % 10 == 0 and (v := test.verdict()).decision != "continue":
                    promoted += v.decision == "promote"
                    seen.append(n_c)
                    break
    return {
        "runs": runs,
        "promoted": promoted,
        "rate": promoted / runs,
        "mean_challenger_workflows": float(np.mean(seen)),
        "pool_workflows": len(samples),
        "pool_sla": float(np.mean([x.sla for x in samples])),
    }


def aa_pool(sc: ScenarioConfig, seeds: Sequence[int], n: int) -> list[Sample]:
    """The judge's sample of every workflow of the frozen champion, unshifted world."""
    pool: list[Sample] = []
    for seed in seeds:
        _, loop = play_loop(replace(sc, shift=None), seed, n, LoopConfig(learn=False))
        pool += loop.samples
    return pool


def events_doc(seed: int, evs: Sequence[LoopEvent], arrivals: list[float]) -> list[dict]:
    out = []
    for e in evs:
        out.append(
            {
                "seed": seed,
                "at_h": round(e.at_s / 3600, 3),
                "arrived": int(np.searchsorted(arrivals, e.at_s, side="right")),
                "kind": e.kind,
                "version": e.version,
                "champion": e.champion,
                "reason": e.detail.get("reason"),
                "stats": e.detail.get("stats", {}),
                "metrics": {k: v for k, v in e.detail.items() if k not in ("stats", "rule")},
            }
        )
    return out


def promoted_shifts(events: Sequence[dict]) -> dict[int, dict[str, float]]:
    """Per seed whose champion changed, the shifts the final champion's search rounds moved
    from the shipped one (a round's moves add to those of the version it started from);
    empty for PPO, whose rounds move weights, not shifts."""
    out: dict[int, dict[str, float]] = {}
    for seed in sorted({e["seed"] for e in events}):
        evs = [e for e in events if e["seed"] == seed]
        shifts: dict[str, dict[str, float]] = {"v1": {}}
        for e in evs:
            if e["kind"] == "round":
                m = e["metrics"]
                own = shifts.get(m.get("from", e["champion"]), {}).copy()
                for k, v in m.items():
                    if k.startswith("search/shift_"):
                        name = k.removeprefix("search/shift_")
                        own[name] = round(own.get(name, 0.0) + v, 6)
                shifts[e["version"]] = own
        final = evs[-1]["champion"] if evs else "v1"
        if final != "v1" and shifts.get(final):
            out[seed] = shifts[final]
    return out


def windows_doc(seed: int, windows: Sequence[dict], arrivals: list[float]) -> list[dict]:
    """The loop's judged windows, with the arrivals by the time each was judged."""
    return [
        {"seed": seed, "arrived": int(np.searchsorted(arrivals, w["at_s"], side="right")), **w}
        for w in windows
    ]


def replay_summary(windows: Sequence[dict], shift_at: dict[int, float], limit: float) -> dict:
    """The replay judge's windows in a few numbers: decisions, and fidelity after the shift."""
    after = [w for w in windows if w["at_s"] >= shift_at[w["seed"]]]
    # a window with no workflow to compare has no error (and the judge refused it)
    errs = [w["jct_err"] for w in windows if w["jct_err"] is not None]
    errs_after = [w["jct_err"] for w in after if w["jct_err"] is not None]
    own = [w["own_jct_err"] for w in after if w.get("own_jct_err") is not None]
    q = lambda xs, p: float(np.quantile(xs, p)) if xs else None  # noqa: E731
    return {
        "verdicts": {
            d: sum(w["decision"] == d for w in windows)
            for d in ("continue", "unreliable", "promote", "retire", "measured")
        },
        "fidelity_jct_err": {
            "windows": len(errs),
            "median": q(errs, 0.5),
            "max": q(errs, 1.0),
            "after_shift_median": q(errs_after, 0.5),
            "after_shift_max": q(errs_after, 1.0),
            "over_limit": sum(e > limit for e in errs),
            "limit": limit,
            # each window's alone (the judge gates on the pooled error above)
            "own_after_shift_median": q(own, 0.5),
            "own_after_shift_max": q(own, 1.0),
            "own_over_limit": sum(e > limit for e in own),
        },
    }


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 seeds x 700 workflows, small A/A")
    ap.add_argument("--json", action="store_true", help="print one JSON object (the summary)")
    ap.add_argument("--seeds", type=int, default=None, help="default: 3 (2 with --quick)")
    ap.add_argument("--first-seed", type=int, default=0, help="run seeds from this one on")
    ap.add_argument("--workflows", type=int, default=2000)
    ap.add_argument("--shift-at", type=float, default=0.1, help="share of the run's arrivals")
    ap.add_argument("--held-out", type=int, default=3, help="held-out seeds")
    ap.add_argument("--held-out-workflows", type=int, default=200)
    ap.add_argument(
        "--steady-workflows", type=int, default=600, help="per held-out seed at steady state"
    )
    ap.add_argument(
        "--steady-warmup", type=int, default=400, help="of those, arrivals left uncounted"
    )
    ap.add_argument("--aa-runs", type=int, default=200)
    ap.add_argument("--aa-workflows", type=int, default=600)
    ap.add_argument("--share", type=float, default=0.3)
    ap.add_argument(
        "--explore-share", type=float, default=0.4, help="workflows served sampled, to learn from"
    )
    ap.add_argument("--load", type=float, default=None, help="default: the shift profile's")
    ap.add_argument(
        "--replace-challenger", action="store_true", help="every round replaces the challenger"
    )
    ap.add_argument(
        "--keep-learning",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="shadows keep learning while a challenger is under test",
    )
    ap.add_argument(
        "--min-rounds", type=int, default=1, help="rounds chained before a first challenger"
    )
    ap.add_argument("--every-n", type=int, default=2000)
    ap.add_argument("--window", type=int, default=2000)
    ap.add_argument("--min-samples", type=int, default=100)
    ap.add_argument("--max-samples", type=int, default=300, help="challenger workflows")
    ap.add_argument("--bucket-workflows", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--judge", choices=("replay", "ab"), default=None, help="default: evaluator.judge"
    )
    ap.add_argument(
        "--learner",
        choices=("ppo", "search"),
        default=None,
        help="how rounds fine-tune the heads: PPO on the logs, or a search by paired replay "
        "(no exploration slice, no shadow); default: learner.method",
    )
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    add_finetune_args(ap, lr=2e-3, credit="task-critic")
    args = ap.parse_args()
    if args.seeds is None and not args.quick:
        args.seeds = 3
    if args.quick:
        args.seeds = 2 if args.seeds is None else args.seeds
        args.workflows, args.held_out = 700, 2
        args.held_out_workflows, args.aa_workflows, args.aa_runs = 150, 400, 200
        args.steady_workflows, args.steady_warmup = 400, 250
    return args


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    s = load_settings(profile="shift")
    assert s.sim.shift is not None
    ft = finetune_config(args)
    args.learner = args.learner or s.learner.method
    if args.learner == "search":
        args.explore_share, args.keep_learning = 0.0, False
    judge = args.judge or s.evaluator.judge
    ev = s.evaluator.model_copy(update={"min_samples": args.min_samples, "judge": judge})
    if args.max_samples is not None:
        ev = ev.model_copy(update={"max_samples": args.max_samples})
    cfg = LoopConfig(
        share=args.share,
        every_n=args.every_n,
        window=args.window,
        finetune=ft,
        evaluator=ev,
        explore_share=args.explore_share,
        holdback_share=s.daemon.holdback_share,
        replace_challenger=args.replace_challenger,
        keep_learning=args.keep_learning,
        min_rounds=args.min_rounds,
        learner=args.learner,
        search=s.learner.search,
    )
    wl = replace(s.sim.workload, workflows=args.workflows)
    if args.load is not None:
        wl = replace(wl, load=args.load)
    results: dict[str, list[list[WorkflowResult]]] = {a: [] for a in ARMS}
    events: list[dict[str, Any]] = []
    windows: list[dict[str, Any]] = []  # the replay judge's, every seed's
    runs: list[dict[str, Any]] = []
    promoted: dict[int, GNNScheduler] = {}
    latest: dict[int, GNNScheduler] = {}  # each seed's last learner version, promoted or not
    shift_at: dict[int, float] = {}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        base = replace(s.sim, workload=wl, shift=None)
        at = shift_time(base, seed, args.workflows, args.shift_at)
        sc = replace(base, shift=replace(s.sim.shift, at_s=at))
        shift_at[seed] = at
        arrivals = [w.arrival_s for w in workload(sc, seed, args.workflows)]
        for arm in ARMS:
            t1 = time.perf_counter()
            if arm == "heft_history":
                res = play_policy(sc, seed, args.workflows, arm)
            else:
                # the frozen arm is the champion alone: no learner, and no exploration slice
                alone = replace(cfg, learn=False, explore_share=0.0)
                res, loop = play_loop(
                    sc,
                    seed,
                    args.workflows,
                    cfg if arm == "loop" else alone,
                    desc=None if args.json else f"seed {seed} {arm}",
                )
                if arm == "loop":
                    events += events_doc(seed, loop.events, arrivals)
                    windows += windows_doc(seed, loop.windows, arrivals)
                    if loop.champion != "v1":
                        promoted[seed] = loop.versions[loop.champion]
                    last = max(loop.versions, key=lambda v: int(v[1:]))
                    if last != "v1":
                        latest[seed] = loop.versions[last]
            results[arm].append(res)
            wall = time.perf_counter() - t1
            runs.append({"seed": seed, "arm": arm, "wall_s": round(wall, 1), "shift_at_s": at})
            if not args.json:
                print(f"seed {seed} {arm}: {wall:.0f} s", file=sys.stderr)

    summary: dict[str, Any] = {}
    per_arm = {a: summarize_arm(results[a], shift_at, args.bucket_workflows) for a in ARMS}
    for arm in ARMS:
        summary[f"{arm}_sla"] = per_arm[arm]["after"]["sla"]
        summary[f"{arm}_mean_jct_s"] = per_arm[arm]["after"]["mean_jct_s"]
    promos = [e for e in events if e["kind"] == "promote"]
    first: dict[int, dict[str, Any]] = {}
    for e in promos:
        first.setdefault(e["seed"], e)
    summary["promotions"] = len(promos)
    summary["rollbacks"] = sum(e["kind"] == "rollback" for e in events)
    summary["rounds"] = sum(e["kind"] == "round" for e in events)
    summary["seeds_with_promotion"] = len(first)
    summary["workflows_to_promotion"] = [first[k]["arrived"] for k in sorted(first)]
    summary["promoted_shifts"] = promoted_shifts(events)
    summary["judge"] = judge
    if judge == "replay":
        rs = replay_summary(windows, shift_at, ev.replay.fidelity_max_jct_err)
        summary["replay_verdicts"] = rs["verdicts"]
        summary["replay_fidelity_jct_err"] = rs["fidelity_jct_err"]

    seeds = [HELD_OUT_SEED + i for i in range(args.held_out)]
    versions = {"promoted": promoted, "latest": latest}
    summary["held_out"] = ho = held_out_versions(
        replace(s.sim, workload=wl), versions, seeds, args.held_out_workflows
    )
    summary["held_out_steady"] = held_out_versions(
        replace(s.sim, workload=wl),
        versions,
        seeds,
        args.steady_workflows,
        warmup=args.steady_warmup,
    )
    pool = aa_pool(s.sim, [AA_SEED], args.aa_workflows)
    aa = aa_rate(pool, rule_from(ev), args.share, args.aa_runs)
    summary["aa_false_promotion_rate"] = aa["rate"]
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    steady = summary["held_out_steady"]
    summary["targets"] = {
        "promoted_within_2000": len(first) == args.seeds
        and all(n <= 2000 for n in summary["workflows_to_promotion"]),
        **held_out_targets(ho),
        **{f"{k}_steady": v for k, v in held_out_targets(steady).items()},
        "aa_at_most_5pct": aa["rate"] <= 0.05,
    }
    if "replay_fidelity_jct_err" in summary:  # what the judge gates on: the pooled error
        fe = summary["replay_fidelity_jct_err"]
        summary["targets"]["fidelity_after_shift"] = (
            fe["after_shift_max"] is not None and fe["after_shift_max"] <= fe["limit"]
        )
    doc = {
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "json")},
            "shift": asdict(s.sim.shift),
            "shift_at_s": shift_at,
            "finetune": asdict(ft),
            "search": cfg.search.model_dump(),
            "evaluator": ev.model_dump(),
            "nodes": s.sim.cluster.n_nodes,
            "load": s.sim.workload.load,
        },
        "summary": summary,
        "arms": per_arm,
        "aa": aa,
        "events": events,
        "windows": windows,
        "runs": runs,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "online_shift.json").write_text(json.dumps(to_jsonable(doc), indent=2) + "\n")
    plot(args.out / "online_shift.png", per_arm, events, doc)
    if args.json:
        print(json.dumps(to_jsonable(summary)))
    else:
        table(doc)


if __name__ == "__main__":
    main()
