"""Can `make demo`'s world show the replay judge a better version? The demo profile's
workload with its shift (an hour's restart after an OOM kill) from `--shift-at` of the
arrivals, served in the simulator by the shipped champion while a `TrafficRecorder` records
it as the evaluator would; then every window judged as the demo's judge judges it (the
demo profile's `evaluator.replay`, `--warmup` and `--replays` overriding), the champion
against itself with its memory reservation moved by `--mem` in logit space. Printed: both
on the whole run (hidden truth), and per window the observed and replayed mean JCT and SLA,
the restart cost the recorder had estimated, the verdict and the replayed gain.

By default the recorder's windows are all taken when the run ends, so every window sees the
last estimate of the restart; `--as-they-close` closes each as soon as its workflows end, as
the evaluator does, with only the retries that had ended by then.

    .venv/bin/python experiments/demo_world.py [--workflows 200] [--shift-at 0.25]
        [--nodes-per-kind 8] [--load L] [--restart-s 3600] [--mem-spread 1] [--warmup N]
        [--replays K] [--mem 0.4] [--as-they-close]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import torch

from dagsched.learner.replay_feed import record_run
from dagsched.learner.replay_judge import ReplayJudge, TrafficRecorder, config_from
from dagsched.learner.variants import ShiftedReservation
from dagsched.policy.bundle import load_bundle
from dagsched.registry.store import SHIPPED_CHAMPION
from dagsched.settings import load_settings
from dagsched.sim.config import PRODUCTION_SHIFT
from dagsched.sim.engine import Simulator
from dagsched.sim.runner import stream_workflows
from dagsched.sim.snapshot import SchedulerPolicy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workflows", type=int, default=200)
    ap.add_argument("--shift-at", type=float, default=0.25, help="share of the arrivals")
    ap.add_argument("--nodes-per-kind", type=int, default=8, help="the profile's: 8 (32 nodes)")
    ap.add_argument("--load", type=float, help="default: the demo profile's")
    ap.add_argument("--restart-s", type=float, default=PRODUCTION_SHIFT.oom_restart_s)
    ap.add_argument("--mem-spread", type=float, default=PRODUCTION_SHIFT.mem_spread)
    ap.add_argument("--warmup", type=int, help="default: the demo profile's")
    ap.add_argument("--replays", type=int, help="default: the demo profile's")
    ap.add_argument("--mem", type=float, default=0.4, help="the variant's memory shift (logit)")
    ap.add_argument(
        "--as-they-close",
        action="store_true",
        help="close each window as soon as it can, with what was known then (as the evaluator)",
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile="demo")
    groups = tuple(replace(g, count=args.nodes_per_kind) for g in s.sim.cluster.groups)
    workload = replace(
        s.sim.workload, workflows=args.workflows, load=args.load or s.sim.workload.load
    )
    sc = replace(s.sim, cluster=replace(s.sim.cluster, groups=groups), workload=workload)
    wfs = list(stream_workflows(sc, 0, args.workflows))
    at = wfs[min(len(wfs) - 1, int(args.workflows * args.shift_at))].arrival_s
    sc = replace(
        sc,
        shift=replace(
            PRODUCTION_SHIFT, at_s=at, oom_restart_s=args.restart_s, mem_spread=args.mem_spread
        ),
    )
    cfg = config_from(s.evaluator.replay)
    cfg = replace(
        cfg,
        warmup_workflows=cfg.warmup_workflows if args.warmup is None else args.warmup,
        replays=cfg.replays if args.replays is None else args.replays,
    )
    champion = load_bundle(SHIPPED_CHAMPION, "v1")
    variant = ShiftedReservation(champion, "mem", args.mem, "mem")
    print(
        f"{len(groups) * args.nodes_per_kind} nodes, load {workload.load}, shift at {at:,.0f} s"
        f" of {wfs[-1].arrival_s:,.0f} s of arrivals, restart {args.restart_s:g} s, windows of"
        f" {cfg.window_workflows}, warm-up {cfg.warmup_workflows}, K={cfg.replays}"
    )
    for name, policy in (("champion", champion), (f"mem {args.mem:+g}", variant)):
        out = Simulator(sc, iter(wfs), seed=0).run(SchedulerPolicy(policy))
        print(f"{name}, whole run: mean JCT {out['mean_jct_s']:,.0f} s, "
              f"SLA {out['sla_attainment']:.3f}, OOM kills {out.get('oom_kills')}")  # fmt: skip
    rec = TrafficRecorder.of(cfg)
    windows = record_run(
        lambda arrivals, hook: Simulator(sc, arrivals, seed=0, on_outcome=hook),
        SchedulerPolicy(champion), rec, iter(wfs), as_they_close=args.as_they_close,
    )  # fmt: skip
    judge = ReplayJudge(cfg, sc)
    for w in windows:
        t0 = time.perf_counter()
        r = judge.judge(
            w, lambda _s: SchedulerPolicy(champion), lambda _s: SchedulerPolicy(variant)
        )
        f = r.own_fidelity
        assert f is not None
        cut = f" ({f.censored} still running, JCT cut at the close)" if f.censored else ""
        gain = r.gain["jct"]
        print(
            f"window {w.index}: observed {f.observed_jct_s:,.0f} s, SLA {f.observed_sla:.2f};"
            f" replayed {f.predicted_jct_s:,.0f} s, SLA {f.predicted_sla:.2f}{cut}; restart"
            f" estimated {w.oom_restart_s:,.0f} s; "
            f"{r.decision} ({r.reason}); replayed JCT gain "
            f"{'-' if gain is None else f'{gain:+.1%}'} ({time.perf_counter() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
