"""How many workflows the evaluator's sequential test needs to promote a challenger that is
really better: the frozen champion against the same champion with a larger memory margin
(`experiments/shift_probe.py`'s probe, the best a head fine-tune found offline), in the `shift`
profile's world.

Both versions play the same workload (one seed, `--workflows`) alone; their per-workflow
samples (SLA met, mean reward of its attempts: what the judge sees) form two pools. Then
`--runs` A/B tests draw from them at random with the loop's split (`--share` of workflows to
the challenger; a verdict every 10 challenger workflows, as `bench/aa_false_promotions.py`)
until the test decides.

    .venv/bin/python experiments/judge_power.py [--margin 0.6] [--workflows 400] [--seed 40000]
        [--shares 0.3,0.5] [--min-samples 100] [--runs 100]
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
from shift_probe import with_margin

from dagsched.learner.live_ab import Sample, rule_from
from dagsched.learner.sequential import ABTest
from dagsched.learner.sim_loop import LoopConfig, SimLoop
from dagsched.policy.bundle import load_bundle
from dagsched.policy.scheduler import GNNScheduler
from dagsched.settings import load_settings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.runner import stream_workflows

CHAMPION = Path(__file__).resolve().parent.parent / "models" / "champion"


def pool(sched: GNNScheduler, sc: ScenarioConfig, seed: int, n: int) -> list[Sample]:
    """The judge's sample of every finished workflow of `sched` alone."""
    loop = SimLoop(sched, LoopConfig(learn=False), seed=seed)
    loop.run(loop.simulator(sc, stream_workflows(sc, seed, n), seed))
    return loop.samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--margin", type=float, default=0.6)
    ap.add_argument("--workflows", type=int, default=400)
    ap.add_argument("--seed", type=int, default=40_000)
    ap.add_argument("--shares", default="0.3,0.5")
    ap.add_argument("--min-samples", type=int, default=100)
    ap.add_argument("--runs", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    s = load_settings(profile="shift")
    sc = replace(s.sim, workload=replace(s.sim.workload, workflows=args.workflows))
    champion = load_bundle(CHAMPION, "v1")
    a = pool(champion, sc, args.seed, args.workflows)
    b = pool(with_margin(champion, args.margin), sc, args.seed, args.workflows)
    for name, p in (("frozen", a), (f"margin {args.margin:+g}", b)):
        x = np.array([(v.sla, v.reward, v.speed) for v in p])
        (sla, rew, spd), sd = x.mean(0), x.std(0)
        print(
            f"{name}: SLA {sla:.3f}, mean reward {rew:.3f} (sd {sd[1]:.3f}), "
            f"speed {spd:.3f} (sd {sd[2]:.3f})"
        )
    rule = rule_from(s.evaluator.model_copy(update={"min_samples": args.min_samples}))
    for share in (float(v) for v in args.shares.split(",")):
        decided: list[tuple[str, int]] = []
        for r in range(args.runs):
            rng = np.random.default_rng(r)
            test, n_c = ABTest(rule), 0
            while True:
                chall = rng.random() < share
                src = b if chall else a
                x = src[rng.integers(len(src))]
                test.add("challenger" if chall else "champion", x.sla, x.reward, x.speed)
                if chall:
                    n_c += 1
                    if n_c % 10 == 0 and (v := test.verdict()).decision != "continue":
                        decided.append((v.decision, n_c))
                        break
        kinds = [d for d, _ in decided]
        med = float(np.median([n for _, n in decided]))
        print(
            f"share {share}: {kinds.count('promote')}/{args.runs} promoted; median "
            f"{med:.0f} challenger workflows (~{med / share:.0f} workflows in all)"
        )


if __name__ == "__main__":
    main()
