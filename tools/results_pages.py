"""The docs' results pages, generated from the benchmarks' JSON: nobody types a result.

Reads `bench/results/**/*.json` and writes `docs/results/*.md`, each table under the command
that made it, the commit it measured and the date. Both come from the JSON where the bench
wrote them (`commit` and `date`, `bench/harness/results.py`; older files: `setup.git` and
`when`); for a JSON without them, the last commit that wrote the file and its date, said so.
Charts next to a JSON (`*.png`) are copied beside the pages.

    python tools/results_pages.py            # the pages (also run by every `mkdocs build`)
    python tools/results_pages.py --readme   # and README.md's results block and its chart

The pages are not committed (`docs/results/` is in .gitignore): the mkdocs hook
(`tools/docs_hooks.py`) writes them before every build, so they never go stale. README's
block and `docs/assets/baselines_jct.png` are committed, rewritten by `make docs`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PAGES = REPO / "docs" / "results"
README = REPO / "README.md"
CHART = REPO / "docs" / "assets" / "baselines_jct.png"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
X, DASH = "\u00d7", "\u2013"  # times and en dash, in the pages' prose

# Results of the policy's world measured before it took its current shape are marked so.
WORLD_SINCE = "2026-12-01T03:00:00Z"
WORLD_IS = "hidden truth (tasks do not use what they declare) and nodes that backfill"

REPLAY_SPEED_COLUMNS = [
    "workers",
    "pool start (s)",
    "window (s)",
    "replays/s",
    "speed-up",
    "same results",
]
BASELINES = ["heft_history", "heft", "tetris", "least_loaded", "first_fit", "random"]


@dataclass(frozen=True)
class Source:
    """One results file: its data, the commit it measured and when, and where those came from."""

    path: Path
    data: Any
    commit: str
    date: str
    stamped: bool  # commit and date from the JSON itself, not from git log

    @property
    def rel(self) -> str:
        return self.path.relative_to(REPO).as_posix()

    def before_world(self) -> bool:
        return self.date < WORLD_SINCE

    def stamp_line(self, command: str) -> str:
        """`command` · commit · date · file, the line every table sits under."""
        commit = self.commit[:7] + (" (modified tree)" if self.commit.endswith("+dirty") else "")
        how = "" if self.stamped else " (the file's last commit)"
        date = self.date.replace("T", " ").replace("Z", " UTC")
        return f"`{command}` · commit `{commit}`{how} · {date} · `{self.rel}`"


def _git(*argv: str) -> str:
    try:
        done = subprocess.run(["git", *argv], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def _utc(text: str) -> str:
    """An ISO or `YYYY-mm-dd HH:MM:SS UTC` time as `YYYY-mm-ddTHH:MM:SSZ`."""
    text = text.replace(" UTC", "+00:00").replace("Z", "+00:00")
    when = datetime.fromisoformat(text)
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def load(rel: str) -> Source | None:
    """The results file `bench/results/<rel>`, or None when it is not there."""
    path = RESULTS / rel
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    meta = data if isinstance(data, dict) else {}
    setup = meta.get("setup", {}) if isinstance(meta.get("setup"), dict) else {}
    commit = meta.get("commit") or setup.get("git", {}).get("commit", "")
    date = meta.get("date") or meta.get("when") or setup.get("when", "")
    if commit and date:
        return Source(path, data, commit, _utc(date), True)
    logged = _git("log", "-1", "--format=%H%x09%cI", "--", str(path))
    if logged:
        sha, when = logged.split("\t")
        return Source(path, data, commit or sha, _utc(date or when), bool(commit and date))
    mtime = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat()
    return Source(path, data, commit or "uncommitted", _utc(date or mtime), False)


# --- formatting ---------------------------------------------------------------------------


def num(x: Any, digits: int = 0) -> str:
    """A number with thousands separators; a dash for a missing one."""
    if x is None:
        return "\u2013"
    if isinstance(x, bool):
        return "yes" if x else "no"
    return f"{x:,.{digits}f}"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], right: int = 1) -> list[str]:
    """A Markdown table; columns from `right` on are right-aligned."""
    align = ["---" if i < right else "---:" for i in range(len(headers))]
    out = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def section(title: str, what: str, src: Source, command: str, body: list[str]) -> list[str]:
    """A titled table with what it measures and its stamp line."""
    out = [f"## {title}", "", what, "", src.stamp_line(command), ""]
    if src.before_world():
        out += [
            f'!!! warning "Measured before the current world ({WORLD_IS})"',
            "",
            "    Kept for the record; run the command again to refresh it.",
            "",
        ]
    return out + body


def chart(src: Source, png: str, alt: str) -> list[str]:
    """Copy `png` (next to the JSON) beside the pages and show it; nothing if it is absent."""
    path = src.path.parent / png
    if not path.is_file():
        return []
    name = src.path.parent.relative_to(RESULTS).as_posix().replace("/", "_").strip(".")
    target = PAGES / "img" / (f"{name}_{png}" if name else png)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not target.is_file() or target.read_bytes() != path.read_bytes():
        shutil.copyfile(path, target)
    return [f"![{alt}](img/{target.name})", ""]


# --- the pages ----------------------------------------------------------------------------


def faithful_rows(src: Source, truth: str) -> list[list[str]]:
    rows = [r for r in src.data["rows"] if r["truth"] == truth]
    rows.sort(
        key=lambda r: (r["load"], BASELINES.index(r["policy"]) if r["policy"] in BASELINES else 99)
    )
    return [
        [
            f"{r['load']:.2f}",
            f"`{r['policy']}`",
            num(r["sla_attainment"], 3),
            num(r["mean_jct_s"]),
            num(r["p95_jct_s"]),
            num(r["reserved_util"], 2),
            num(r["used_util"], 2),
            num(r["oom_kills"], 1),
            num(r["workflows_failed"], 1),
        ]
        for r in rows
    ]


def policy_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            r["scenario"],
            f"`{r['policy']}`",
            num(r["sla_attainment"], 3),
            num(r["mean_jct_s"]),
            num(r["p95_jct_s"]),
            num(r.get("oom_kills"), 1),
            num(r.get("seeds")),
        ]
        for r in rows
    ]


def baselines_page() -> list[str]:
    out = [
        "# Baselines",
        "",
        "Every hand-written policy at steady state: what the learned policy is measured "
        "against (see [the simulated world](../concepts/world.md)).",
        "",
    ]
    if src := load("faithful_world.json"):
        head = [
            "load",
            "policy",
            "SLA",
            "mean JCT s",
            "p95 JCT s",
            "reserved",
            "used",
            "OOM kills",
            "failed workflows",
        ]
        out += section(
            "The world's baselines",
            f"Held-out seeds 10000{DASH}10004 {X} 200 workflows, faults on, means over "
            "seeds. "
            "*Hidden*: tasks use what their family's hidden truth says; *exact*: what "
            "they declare.",
            src,
            "python bench/faithful_world.py",
            [
                "### Hidden truth",
                "",
                *table(head, faithful_rows(src, "hidden"), 2),
                "### Exact truth",
                "",
                *table(head, faithful_rows(src, "exact"), 2),
            ],
        )
    if src := load("ppo_headroom.json"):
        head = ["scenario", "policy", "SLA", "mean JCT s", "p95 JCT s", "OOM kills", "seeds"]
        out += section(
            "What ordering and perfect information buy",
            "`heft_history` with each queue-priority rule, and fed perfect information "
            "(`oracle_res`: reservations at each task's real use x 1.05; "
            "`_runtime`: also its real run time) with FIFO queues and with SRPT: "
            "what a learned policy could find on top of its base "
            "(`heft_history_srpt`). `model` is the shipped champion.",
            src,
            src.data.get("command", "python bench/ppo_headroom.py"),
            table(head, policy_rows(src.data["rows"]), 2),
        )
    return out


def eval_section(src: Source, title: str, command: str) -> list[str]:
    rows: list[dict[str, Any]] = src.data
    default = [r for r in rows if r["scenario"] == "default"] or rows
    head = [
        "policy",
        "SLA",
        "mean JCT s",
        "p95 JCT s",
        "cost core-s",
        "total reward",
        "decision ms",
    ]
    body = table(
        head,
        (
            [
                f"`{r['policy']}`",
                num(r["sla_attainment"], 3),
                num(r["mean_jct_s"]),
                num(r["p95_jct_s"]),
                num(r["cost_core_s"]),
                num(r["total_reward"], 1),
                num(r["decision_ms"], 2),
            ]
            for r in default
        ),
    )
    scenarios = sorted({r["scenario"] for r in rows})
    if len(scenarios) > 1:
        means = []
        for policy in dict.fromkeys(r["policy"] for r in rows):
            mine = [r for r in rows if r["policy"] == policy]
            means.append(
                [
                    f"`{policy}`",
                    num(sum(r["sla_attainment"] for r in mine) / len(mine), 3),
                    num(sum(r["mean_jct_s"] for r in mine) / len(mine)),
                    num(len(mine)),
                ]
            )
        body = [
            "Default scenario:",
            "",
            *body,
            f"Mean over the scenarios ({', '.join(scenarios)}):",
            "",
            *table(["policy", "SLA", "mean JCT s", "scenarios"], means),
        ]
    return section(
        title,
        "`dagsched eval`: the model against every baseline on held-out seeds.",
        src,
        command,
        body + chart(src, "jct.png", "mean JCT per scenario"),
    )


def evaluation_page() -> list[str]:
    out = [
        "# Evaluation",
        "",
        "`dagsched eval` plays a model and the baselines on the same held-out seeds and "
        "writes `eval.md`, `eval.csv`, `eval.json` and charts. The policy is being rebuilt "
        "as a residual over `heft_history`; these pages change when the command is run "
        "again.",
        "",
    ]
    if src := load("eval/eval.json"):
        out += eval_section(src, "The shipped model against the baselines", EVAL_COMMAND)
    if src := load("eval_mcts/eval.json"):
        out += eval_section(
            src,
            "MCTS",
            "dagsched eval --model models/champion --seeds 1 "
            "--workflows 30 --mcts-workflows 8 --policies "
            "champion,heft,least_loaded,mcts --scenarios default,load:0.95 "
            "--out bench/results/eval_mcts",
        )
    return out


ONLINE_SHIFT = {
    "online_shift_search/online_shift.json": "python bench/online_shift.py --seeds 1 "
    "--learner search --out bench/results/online_shift_search",
    "online_shift_search_seed1/online_shift.json": "python bench/online_shift.py --seeds 1 "
    "--first-seed 1 --learner search --out bench/results/online_shift_search_seed1",
    "online_shift_quick_seed0/online_shift.json": "python bench/online_shift.py --quick "
    "--seeds 1 --out bench/results/online_shift_quick_seed0",
    "online_shift_quick_seed1/online_shift.json": "python bench/online_shift.py --quick "
    "--seeds 1 --first-seed 1 --out bench/results/online_shift_quick_seed1",
    "online_shift.json": "python bench/online_shift.py --seeds 1",
    "online_shift_quick.json": "python bench/online_shift.py --quick",
    "online_shift_keep_learning.json": "python bench/online_shift.py --keep-learning",
    "online_shift_explore.json": "python bench/online_shift.py --quick --load 0.7 "
    "--explore-share 0.2",
    "online_shift_min_rounds6/online_shift.json": "python bench/online_shift.py --min-rounds 6",
}


LEARNERS = {"ppo": "PPO on the logs", "search": "a search of the heads' shifts by paired replay"}


REPLAY_INTERFERENCE = {
    "replay_interference.json": "python bench/replay_interference.py",
    "replay_interference_quick.json": "python bench/replay_interference.py --quick",
    "replay_interference_baseline_quick.json": "python bench/replay_interference.py --quick "
    "--baseline",
}


def learning_page() -> list[str]:
    out = [
        "# Learning while serving",
        "",
        "The loop (learner, sequential A/B test, guardrail) played in the simulator, and the "
        "services' switch time. How versions are judged: [Judging](../concepts/judging.md).",
        "",
    ]
    for rel, command in ONLINE_SHIFT.items():
        if not (src := load(rel)):
            continue
        s, arms = src.data["summary"], src.data["arms"]
        rows = [
            [
                f"`{a}`",
                num(arms[a]["before"]["sla"], 3),
                num(arms[a]["before"]["mean_jct_s"]),
                num(arms[a]["after"]["sla"], 3),
                num(arms[a]["after"]["mean_jct_s"]),
            ]
            for a in ("frozen", "loop", "heft_history")
        ]
        held = s["held_out"]
        steady = s.get("held_out_steady", {})
        held_rows = [
            [
                f"`{k}`",
                num(v["sla"], 3),
                num(v["mean_jct_s"]),
                *([num(steady[k]["sla"], 3), num(steady[k]["mean_jct_s"])] if steady else []),
            ]
            for k, v in held.items()
            if isinstance(v, dict) and "sla" in v
        ]
        cfg = src.data["config"]
        what = (
            f"{cfg['seeds']} seeds {X} {cfg['workflows']:,} workflows of the `shift` profile "
            f"(load {cfg['load']}), the shift on at {cfg['shift_at']:.0%} of the arrivals"
            + (
                f" (families ship a release every {every:g} of their workflows)"
                if (every := cfg.get("shift", {}).get("release_every"))
                else ""
            )
            + "; "
            f"challenger share {cfg['share']}, exploration {cfg.get('explore_share', 0)}; "
            f"rounds by {LEARNERS[cfg.get('learner', 'ppo')]}. "
            f"Promotions: {s['promotions']}, rollbacks: {s['rollbacks']}, rounds: "
            f"{s['rounds']}; A/A false promotions of the per-workflow A/B "
            f"{s['aa_false_promotion_rate']:.1%}."
        )
        if rv := s.get("replay_verdicts"):
            fe = s["replay_fidelity_jct_err"]
            counts = ", ".join(f"{k} {v}" for k, v in rv.items())
            what += f" Judged by the replay judge: windows {counts}; " + (
                "fidelity (the serving version's mean JCT error) median "
                f"{num(100 * fe['median'], 1)}%, worst {num(100 * fe['max'], 1)}%, "
                f"{fe['over_limit']} of {fe['windows']} windows over {fe['limit']:.0%}."
                if fe["windows"]
                else "no window was judged."
            )
        else:
            what += " Judged by the per-workflow A/B."
        body = [
            *table(
                ["arm", "SLA before", "mean JCT s before", "SLA after", "mean JCT s after"], rows
            ),
            f"Held out ({cfg['held_out']} seeds, shift from t=0: "
            f"{cfg['held_out_workflows']} workflows from an empty cluster"
            + (
                f", and at steady state the arrivals after the first "
                f"{cfg['steady_warmup']:,} of {cfg['steady_workflows']:,}"
                if steady
                else ""
            )
            + "; `latest` is the learner's last version, not promoted):",
            "",
            *table(
                ["version", "SLA", "mean JCT s"]
                + (["SLA, steady", "mean JCT s, steady"] if steady else []),
                held_rows,
            ),
        ]
        png = src.path.with_suffix(".png").name
        out += section(
            f"The loop in the shifted world: `{rel}`",
            what,
            src,
            command,
            body + chart(src, png, "SLA per 100 arrivals"),
        )
    for rel, command in REPLAY_INTERFERENCE.items():
        if not (src := load(rel)):
            continue
        rows = []
        for r in src.data["seeds"]:
            v, c = r["variant"], r["copy"]
            fv, fc, st = v["first_verdict"], c["first_verdict"], v["stats"]["jct"]
            whole = r["whole_variant"]["mean_jct_s"] / r["whole_champion"]["mean_jct_s"] - 1
            rows.append(
                [
                    r["seed"],
                    f"{whole:+.1%}",
                    "none" if fv is None else f"{fv['decision']} at {fv['workflows']}",
                    f"{st['diff']:+.3f} [{st['lower']:+.3f}, {st['upper']:+.3f}]",
                    "none" if fc is None else f"{fc['decision']} at {fc['workflows']}",
                    " ".join(
                        "n/a" if w["jct_err"] is None else f"{w['jct_err']:.0%}"
                        for w in v["windows"]
                    ),
                ]
            )
        cfg = src.data["config"]
        champ = "heft_history" if cfg.get("baseline") else "the shipped champion"
        out += section(
            f"The replay judge on the interference case: `{rel}`",
            f"{champ} serving {cfg['workflows']} workflows of `shift`; the variant "
            f"reserves CPU {cfg['shift']:+g} in logit space; windows of "
            f"{cfg['window']}, warm-up {cfg['warmup']}, K={cfg['replays']}. "
            "Whole-cluster JCT is the variant serving everything against the "
            "champion (negative: the variant is faster); the JCT difference is "
            "the replays' relative reduction with its 95% confidence sequence.",
            src,
            command,
            table(
                [
                    "seed",
                    "JCT whole, variant/champion",
                    "variant: first verdict",
                    "variant JCT diff [CS]",
                    "copy: first verdict",
                    "fidelity by window",
                ],
                rows,
            ),
        )
    if src := load("aa_false_promotions.json"):
        out += section(
            "False promotions of the sequential test",
            "Simulated per-workflow outcomes, the evaluator's rule: "
            f"{src.data['rule']}; "
            f"challenger share {src.data['share']}.",
            src,
            "python bench/aa_false_promotions.py",
            table(
                ["case", "runs", "promoted", "rate", "retired", "challenger workflows (mean)"],
                (
                    [
                        r["case"],
                        r["runs"],
                        r["promoted"],
                        f"{r['promote_rate']:.1%}",
                        r["retired"],
                        num(r["mean_challenger_workflows"]),
                    ]
                    for r in src.data["rows"]
                ),
            ),
        )
    if src := load("ab_interference.json"):
        rows = []
        for s in src.data["seeds"]:
            ab = s["ab"]
            rows.append(
                [
                    s["seed"],
                    f"{s['whole_variant']['speed'] - s['whole_champion']['speed']:+.3f}",
                    f"{ab['speed']['diff']:+.3f} [{ab['speed']['lower']:+.3f}, "
                    f"{ab['speed']['upper']:+.3f}]",
                    f"{s['whole_variant']['sla'] - s['whole_champion']['sla']:+.3f}",
                    f"{ab['sla']['diff']:+.3f} [{ab['sla']['lower']:+.3f}, "
                    f"{ab['sla']['upper']:+.3f}]",
                ]
            )
        out += section(
            "What a per-workflow A/B sees on a shared cluster",
            "The champion against a variant that packs tighter: each alone on the "
            "cluster, then a 50/50 A/B on one cluster (95% confidence sequences).",
            src,
            "python bench/ab_interference.py",
            table(
                ["seed", "speed, whole cluster", "speed, A/B", "SLA, whole cluster", "SLA, A/B"],
                rows,
            )
            + chart(src, "ab_interference.png", "A/B against whole-cluster runs"),
        )
    for rel, command in (
        ("drift.json", "python bench/drift.py --seeds 6"),
        (
            "drift_replace_kl01/drift.json",
            "python bench/drift.py --replace-challenger --target-kl 0.1",
        ),
    ):
        if not (src := load(rel)):
            continue
        s = src.data["summary"]
        rows = [
            [
                f"`{arm}`",
                num(s["pre_drift_sla"][arm], 3),
                num(s["post_drift_sla"][arm], 3),
                num(s["final_hour_sla"][arm], 3),
            ]
            for arm in s["pre_drift_sla"]
        ]
        cfg = src.data["config"]
        out += section(
            f"Drift: `{rel}`",
            f"{cfg['seeds']} seeds \u00d7 {cfg['hours']} simulated hours; at minute "
            f"{cfg['drift_at_min']:.0f} a quarter of the nodes turn "
            f"{cfg['drift']['slowdown']}{X} slower, unannounced. Rounds {s['rounds']}, "
            f"promotions {s['promotions']}, rollbacks {s['rollbacks']}.",
            src,
            command,
            table(["arm", "SLA before", "SLA after", "SLA final hour"], rows)
            + chart(src, "drift.png", "SLA over simulated time"),
        )
    if src := load("switch_time.json"):
        s, i = src.data["summary"], src.data["integrity"]
        rows = [
            ["switches within 1 s", f"{s['within_target']} of {s['switches']}"],
            ["p50 / max s", f"{s['switch_s_p50']:.3f} / {s['switch_s_max']:.3f}"],
            ["alias write → notice (p50 s)", f"{s['alias_to_notice_s_p50']:.3f}"],
            ["notice → swapped (p50 s)", f"{s['notice_to_swapped_s_p50']:.3f}"],
            ["tasks asked / decided", f"{i['tasks_asked']:,} / {i['tasks_decided']:,}"],
            ["lost / decided twice", f"{i['lost']} / {i['decided_twice']}"],
        ]
        out += section(
            "Switch time",
            "From the champion alias write to every replica serving the new version, "
            "under live traffic (two `dagsched daemon` processes).",
            src,
            "python bench/switch_time.py",
            table(["", "measured"], rows),
        )
    return out


def speed_page() -> list[str]:
    out = [
        "# Speed",
        "",
        "Throughput and latency on the project's shared 2-core CI machine: figures move "
        "±30% with what else runs there; compare runs made in the same minutes.",
        "",
    ]
    for rel, command in (
        ("sim_speed.json", "python bench/sim_speed.py --repeats 3"),
        (
            "sim_speed_backfill.json",
            "python bench/sim_speed.py --repeats 3 --out bench/results/sim_speed_backfill.json",
        ),
    ):
        if src := load(rel):
            rows = [
                [
                    num(r["nodes"]),
                    num(r["placements"]),
                    num(r["placements_per_s"]),
                    f"{num(r['placements_per_s_min'])} \u2013 {num(r['placements_per_s_max'])}",
                ]
                for r in src.data["speed"]
            ]
            mem = ", ".join(f"{m['traced_mib']:.1f}" for m in src.data["memory"])
            out += section(
                f"Simulator: `{rel}`",
                "Placements per wall second on one core, least-loaded, faults on. "
                f"Traced memory after each 1,000 workflows of a long run: {mem} MiB.",
                src,
                command,
                table(["nodes", "placements", "per s (median)", "min \u2013 max"], rows),
            )
    if src := load("train_speed.json"):
        d = src.data
        out += section(
            "Training",
            "PPO updates with their rollouts, default settings.",
            src,
            "python bench/train_speed.py",
            table(
                ["device", "threads", "updates/s", "decisions/s"],
                [
                    [
                        d["device"],
                        d["threads"],
                        num(d["updates_per_s"], 2),
                        num(d["decisions_per_s"]),
                    ]
                ],
            ),
        )
    if src := load("replay_speed.json"):
        cfg = src.data["config"]
        rows = [
            [
                r["workers"],
                num(r["startup_s"], 1),
                num(r["window_s"], 1),
                num(r["replays_per_s"], 2),
                f"{r['speedup']:.2f}{X}",
                "yes" if r["same_results"] else "NO",
            ]
            for r in src.data["runs"]
        ]
        out += section(
            "Replay judge",
            f"One window of the `shift` profile judged as the evaluator judges it: K="
            f"{cfg['replays']} replays of the champion and K of a challenger, "
            f"{num(cfg['replayed_workflows'])} workflows replayed each (warm-up, window, later "
            "arrivals), in the service's thread (1 worker) and in worker processes "
            "(`evaluator.replay.workers`). The pool's start-up is paid once per service.",
            src,
            "python bench/replay_speed.py",
            table(REPLAY_SPEED_COLUMNS, rows),
        )
    if src := load("inference_speed.json"):
        out += section(
            "Inference",
            "The shipped model on the default 32-node cluster: one "
            "forward pass per batch (`batched`, `compiled` with torch.compile) and "
            "`GNNScheduler.place` as the daemon calls it (`served`).",
            src,
            "python bench/inference_speed.py",
            table(
                ["batch", "batched /s", "compiled /s", "served /s"],
                (
                    [
                        r["batch"],
                        num(r["batched_decisions_per_s"]),
                        num(r["compiled_decisions_per_s"]),
                        num(r["served_decisions_per_s"]),
                    ]
                    for r in src.data["rows"]
                ),
            ),
        )
    if src := load("explain_speed.json"):
        out += section(
            "Explaining a decision",
            "`explain_observation` on one decision of the "
            "default cluster, imports and model loading excluded.",
            src,
            "python bench/explain_speed.py",
            table(
                ["targets", "heatmap", "threads", "median s", "min s", "max s"],
                (
                    [
                        r["targets"],
                        num(r["heatmap"]),
                        r["threads"],
                        num(r["median_s"], 2),
                        num(r["min_s"], 2),
                        num(r["max_s"], 2),
                    ]
                    for r in src.data["rows"]
                ),
            ),
        )
    if src := load("map_burst.json"):
        out += section(
            "A map stage on the served path",
            "`width` ready siblings of one workflow placed in batches of 64.",
            src,
            "python bench/map_burst.py",
            table(
                ["width", "seconds", "decisions/s (fast path)", "decisions/s (plain forward)"],
                (
                    [
                        num(r["width"]),
                        num(r["fast_s"], 3),
                        num(r["fast_per_s"]),
                        num(r["plain_per_s"]),
                    ]
                    for r in src.data["rows"]
                ),
            ),
        )
    if src := load("daemon_burst.json"):
        out += section(
            "A map stage through the daemon",
            "From the first `task_ready` handed to the producer to the last decision read back.",
            src,
            "python bench/daemon_burst.py",
            table(
                ["width", "first decision s", "last decision s", "decisions/s"],
                (
                    [
                        num(r["width"]),
                        num(r["first_decision_s"], 3),
                        num(r["last_decision_s"], 3),
                        num(r["per_s"]),
                    ]
                    for r in src.data["rows"]
                ),
            ),
        )
    for rel, command in (
        ("daemon_throughput.json", "python bench/daemon_throughput.py --json"),
        ("daemon_throughput_quick.json", "python bench/daemon_throughput.py --quick --json"),
    ):
        if src := load(rel):
            out += throughput_section(src, rel, command)
    for rel, command in (
        ("soak.json", "python bench/soak.py"),
        ("soak_quick.json", "python bench/soak.py --quick"),
    ):
        if src := load(rel):
            out += soak_section(src, rel, src.data.get("command", command))
    return out


def soak_section(src: Source, rel: str, command: str) -> list[str]:
    """bench/soak.py: its targets, then one row per period (see docs/operations/soak.md)."""
    d, st = src.data, src.data["setup"]
    mib = 2**20

    def value(key: str, x: Any) -> str:
        if x is None:
            return DASH
        if key == "rss_growth":
            return f"{x:+.1%}"
        if key == "redis_bytes_per_decision_per_s":
            return f"{x / mib:.2f} MiB"
        return num(x, 0 if isinstance(x, int) else 2)

    targets = [
        [
            f"`{k}`",
            value(k, v["measured"]),
            f"{'≥' if k == 'decided_vs_offered' else '≤'} {value(k, v['bound'])}",
            num(v["met"]),
        ]
        for k, v in d["summary"]["targets"].items()
    ]
    rows = [
        [
            f"{p['from_s'] / 60:.1f}{DASH}{p['to_s'] / 60:.1f}",
            num(p["decided_per_s"]),
            num(p["p50_ms"]),
            num(p["p99_ms"]),
            num(p["lag_max_s"], 2),
            num((p["daemon_rss"] or 0) / mib),
            num((p["redis_used_memory"] or 0) / mib),
            num(p["cpu_cores"].get("broker"), 2),
        ]
        for p in d["periods"]
    ]
    what = (
        f"One `dagsched daemon` and one `dagsched updater` under {num(st['rate'])} tasks/s "
        f"for {st['seconds'] / 60:g} minutes, workflows whose tasks become ready as their "
        f"parents finish ([the soak](../operations/soak.md)); broker: {st.get('broker', '')}. "
        f"Warm-up: the first {num(st['warmup_s'])} s."
    )
    return section(
        f"Soak: `{rel}`",
        what,
        src,
        command,
        table(["target", "measured", "bound", "met"], targets)
        + table(
            [
                "minutes",
                "decided/s",
                "p50 ms",
                "p99 ms",
                "lag max s",
                "daemon RSS MiB",
                "Redis MiB",
                "broker CPU",
            ],
            rows,
        )
        + chart(src, Path(rel).with_suffix(".png").name, f"soak over time ({rel})"),
    )


def throughput_section(src: Source, rel: str, command: str) -> list[str]:
    configs = src.data["configs"]
    rates = [str(r) for r in src.data["setup"]["rates"]]
    rows = []
    for name, c in configs.items():
        lat = c.get("latency", {})
        cells = [
            f"{num(lat[r]['p50_ms'])} / {num(lat[r]['p99_ms'])}" if r in lat else "\u2013"
            for r in rates
        ]
        rows.append(
            [
                f"`{name}`",
                num(c["saturation"]["per_s"]),
                num(c["saturation"].get("replica_cpu_us")),
                *cells,
            ]
        )
    served = ", ".join(f"{num(r['per_s'])} at {num(r['nodes'])} nodes" for r in src.data["served"])
    met = src.data["summary"].get("targets_met", {})
    return section(
        f"Daemon throughput: `{rel}`",
        "Decisions per second through the daemon against a passthrough (the "
        "daemon's Kafka path with no policy and no Redis), and latency under paced "
        f"load. Served path alone: {served} decisions/s. Redis: "
        f"{num(src.data['summary'].get('redis_bytes_per_decision'))} bytes per "
        "decision.",
        src,
        command,
        table(
            [
                "configuration",
                "decisions/s",
                "replica CPU µs / decision",
                *[f"p50 / p99 ms at {int(r):,}/s" for r in rates],
            ],
            rows,
        )
        + table(["target", "met"], ([f"`{k}`", num(v)] for k, v in met.items())),
    )


def index_page(pages: dict[str, list[str]]) -> list[str]:
    out = [
        "# Results",
        "",
        "Generated from `bench/results/*.json` by `tools/results_pages.py` on every docs "
        "build: each table names the command that made it, the commit it measured and the "
        "date. To refresh one, run its command and rebuild the docs (`make docs`).",
        "",
        "| page | results |",
        "|---|---|",
    ]
    for name, lines in pages.items():
        files = sorted(
            {
                ln.rsplit("`", 2)[-2]
                for ln in lines
                if ln.startswith("`python") or ln.startswith("`dagsched")
            }
        )
        title = lines[0].removeprefix("# ")
        out.append(f"| [{title}]({name}.md) | {', '.join(f'`{f}`' for f in files)} |")
    return [
        *out,
        "",
        "Experiment logs and one-off studies are in `experiments/` and `CHANGELOG.md`; "
        "the daemon's step-by-step speed history in "
        "`bench/results/daemon_throughput_history.md`.",
        "",
    ]


PAGE_BUILDERS: dict[str, Callable[[], list[str]]] = {
    "baselines": baselines_page,
    "evaluation": evaluation_page,
    "learning": learning_page,
    "speed": speed_page,
}


def write_if_changed(path: Path, text: str) -> bool:
    """Write `text` unless `path` already holds it (a rewrite would wake `mkdocs serve`)."""
    if path.is_file() and path.read_text() == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return True


def generate() -> list[Path]:
    """Write every results page; returns the pages that changed."""
    pages = {name: build() for name, build in PAGE_BUILDERS.items()}
    changed = []
    for name, lines in {"index": index_page(pages), **pages}.items():
        path = PAGES / f"{name}.md"
        if write_if_changed(path, "\n".join(lines).rstrip() + "\n"):
            changed.append(path)
    return changed


# --- README's block -----------------------------------------------------------------------


EVAL_COMMAND = (
    "dagsched eval --model models/champion --seeds 3 --workflows 200 "
    "--scenarios load:0.5,load:0.8,load:0.95 --policies "
    "champion,heft_history,heft_history_srpt,heft_history_edf,heft,tetris,least_loaded "
    "--out bench/results/eval"
)


def readme_block() -> list[str]:
    """README's results: the shipped model and the baselines at steady state per load, and
    what perfect information and ordering would buy."""
    src = load("eval/eval.json")
    if src is None:
        return ["No results yet: run the command below."]
    rows = {(r["policy"], r["scenario"]): r for r in src.data}
    loads = sorted(
        {r["scenario"] for r in src.data if r["scenario"].startswith("load:")},
        key=lambda s: float(s.split(":")[1]),
    )
    body = []
    for policy in dict.fromkeys(r["policy"] for r in src.data):
        cells = [
            f"{num(rows[policy, x]['sla_attainment'], 3)} / {num(rows[policy, x]['mean_jct_s'])}"
            for x in loads
            if (policy, x) in rows
        ]
        body.append([f"`{policy}`", *cells])
    out = [
        f"SLA attainment / mean JCT (s) at steady state: 3 held-out seeds {X} 200 "
        "workflows per load, hidden truth, faults on. The shipped champion is the learned "
        "policy's starting point, which decides exactly as `heft_history_srpt`:",
        "",
        *table(["policy", *[f"load {x.split(':')[1]}" for x in loads]], body),
    ]
    failing = sorted({r["policy"] for r in src.data if r.get("workflows_failed", 0) >= 1})
    if failing:
        out += [
            "Mean JCT counts completed workflows; "
            + ", ".join(f"`{p}`" for p in failing)
            + " also failed workflows outright (out of retries after OOM kills), which "
            "its SLA attainment counts.",
            "",
        ]
    out += [src.stamp_line(EVAL_COMMAND), ""]
    if head := load("ppo_headroom.json"):
        fifo = {
            r["scenario"]: r["mean_jct_s"]
            for r in head.data["rows"]
            if r["policy"] == "heft_history"
        }
        best = {r["scenario"]: r for r in head.data["rows"] if r["policy"] == "heft_history_srpt"}
        oracle = {
            r["scenario"]: r for r in head.data["rows"] if r["policy"] == "oracle_res_runtime_srpt"
        }
        parts = [
            f"at {s.split(':')[1]} perfect information on top of SRPT ordering reaches "
            f"{num(oracle[s]['mean_jct_s'])} s against `heft_history_srpt`'s "
            f"{num(best[s]['mean_jct_s'])} s and FIFO `heft_history`'s {num(fifo[s])} s"
            for s in sorted(oracle)
            if s in best and s in fifo
        ]
        if parts:
            out += [
                "The headroom a learned policy has to find: " + "; ".join(parts) + ".",
                "",
                head.stamp_line(head.data.get("command", "python bench/ppo_headroom.py")),
                "",
            ]
    return out


def draw_chart(path: Path) -> None:
    """Mean JCT against load per policy at steady state (README's chart), from the eval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    src = load("eval/eval.json")
    if src is None:
        return
    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=100)
    for k, policy in enumerate(dict.fromkeys(r["policy"] for r in src.data)):
        pts = sorted(
            (float(r["scenario"].split(":")[1]), r["mean_jct_s"])
            for r in src.data
            if r["policy"] == policy and r["scenario"].startswith("load:")
        )
        style = {"linestyle": "--", "marker": "x", "zorder": 3} if k == 0 else {"marker": "o"}
        ax.plot([p[0] for p in pts], [p[1] for p in pts], label=policy, **style)
    ax.set_xlabel("load (share of the cluster a good scheduler keeps reserved)")
    ax.set_ylabel("mean JCT (s)")
    ax.set_yscale("log")
    ax.set_title(f"Steady state, 200 workflows a run ({src.date[:10]}, {src.commit[:7]})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def update_readme() -> bool:
    """Rewrite README.md's block between the results markers; False when it has none."""
    text = README.read_text()
    if BEGIN not in text or END not in text:
        return False
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    block = "\n".join(readme_block()).rstrip()
    write_if_changed(README, f"{head}{BEGIN}\n{block}\n{END}{tail}")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Write the pages (and with --readme, README's block and chart)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--readme", action="store_true", help="also README's block and its chart")
    args = ap.parse_args(argv)
    for path in generate():
        print(f"wrote {os.path.relpath(path)}")
    if args.readme:
        if not update_readme():
            print(f"error: README.md has no {BEGIN} ... {END} block", file=sys.stderr)
            return 2
        draw_chart(CHART)
        print(f"wrote README.md's results block and {os.path.relpath(CHART)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
