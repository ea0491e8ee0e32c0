"""`dagsched explain --sample N --out DIR`: explain the most recent decisions, per model
version, and hand the mean attributions to `explain_report.write_report`."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import typer

from dagsched.cli.console import progress_bar, stderr_is_tty
from dagsched.cli.explain.report import SUMMARY_TARGETS, write_report
from dagsched.cli.explain.sources import DecisionStore, Models, one_thread
from dagsched.registry.errors import RegistryError
from dagsched.schemas.messages import DecisionLogMsg


def explain_sample(
    store: DecisionStore,
    models: Models,
    n: int,
    out: Path,
    as_json: bool,
    top: int,
    steps: int,
) -> None:
    """Explain the `n` most recent decisions with the versions that made them; write the
    mean attributions per version as the report in `out` and say what was written."""
    from dagsched.core.observation import observation_from_dict
    from dagsched.policy.attribution import explain_observation
    from dagsched.policy.explanation import CORE_TARGETS, ExplainError

    logs, stored, unreadable = store.recent_logs(n)
    by_version: dict[str, list[DecisionLogMsg]] = defaultdict(list)
    fallback = 0
    for log in logs:
        if log.arm == "fallback" or log.observation is None:
            fallback += 1
        else:
            by_version[log.model_version].append(log)
    sums: dict[str, dict[str, dict[str, float]]] = {}
    counts: dict[str, int] = {}
    arms: dict[str, dict[str, int]] = {}
    errors: dict[str, str] = {}
    incomplete: dict[str, int] = {}
    max_err: dict[str, float] = {}
    total = sum(len(v) for v in by_version.values())
    done = 0
    with one_thread(), progress_bar("explaining", enabled=stderr_is_tty()) as progress:
        for version, items in by_version.items():
            try:
                sched = models.get(version)
            except RegistryError as exc:
                errors[version] = " ".join(str(exc).split())
                done += len(items)
                continue
            acc: dict[str, dict[str, float]] = {t: defaultdict(float) for t in SUMMARY_TARGETS}
            arms[version] = defaultdict(int)
            for log in items:
                done += 1
                progress(done, total)
                assert log.observation is not None
                try:
                    obs = observation_from_dict(log.observation)
                    ex = explain_observation(
                        sched.model,
                        sched.normalizer,
                        obs,
                        log.node_index,
                        targets=CORE_TARGETS,
                        n_steps=steps,
                    )
                except (ValueError, ExplainError):
                    unreadable += 1
                    continue
                counts[version] = counts.get(version, 0) + 1
                arms[version][log.arm] += 1
                if not ex.complete:
                    incomplete[version] = incomplete.get(version, 0) + 1
                max_err[version] = max(max_err.get(version, 0.0), ex.max_error)
                for t in SUMMARY_TARGETS:
                    if t in ex.targets:
                        for name, v in ex.per_feature(t).items():
                            acc[t][name] += v
            if counts.get(version):
                sums[version] = {
                    t: {k: v / counts[version] for k, v in acc[t].items()} for t in SUMMARY_TARGETS
                }
    out.mkdir(parents=True, exist_ok=True)
    report = write_report(
        out,
        n,
        stored,
        logs,
        fallback,
        unreadable,
        sums,
        counts,
        arms,
        errors,
        incomplete,
        max_err,
        models.source,
        top,
    )
    if as_json:
        typer.echo(json.dumps(report))
    else:
        typer.echo(
            f"wrote {out / 'explain.md'}: {len(logs)} decisions, "
            f"{sum(counts.values())} explained over {len(sums)} model version(s), "
            f"{fallback} by the heuristic fallback"
        )
