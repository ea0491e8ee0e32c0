"""The heads' shift search: it moves only the continuous head's output bias, keeps only the
moves that lower the score, in the loop searches on the recorded windows, and replaces a
challenger that fresher windows show to be wrong."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dagsched.core.bounds import ACTION_NAMES
from dagsched.learner.head_search import Scored, SearchStopped, search_shifts, with_shifts
from dagsched.learner.sim_loop import LoopConfig, SimLoop
from dagsched.policy.bundle import load_bundle
from dagsched.policy.model import ActorCritic
from dagsched.policy.scheduler import GNNScheduler
from dagsched.service_config import EvaluatorSettings, HeadSearchSettings
from dagsched.sim.runner import generate_workflows
from tests.sim.conftest import small_scenario

CHAMPION = Path(__file__).resolve().parents[2] / "models" / "champion"


@pytest.fixture(scope="module")
def champion() -> Iterator[GNNScheduler]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield load_bundle(CHAMPION, "v1")
    torch.set_num_threads(threads)


def _shift(model: ActorCritic, name: str) -> float:
    return float(model.cont_head[-1].bias.detach()[2 * ACTION_NAMES.index(name)])


def test_with_shifts_moves_only_the_named_values_bias(champion: GNNScheduler) -> None:
    moved = with_shifts(champion.model, {"mem": 0.5})
    before, after = champion.model.state_dict(), moved.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed == ["cont_head.2.bias"]
    diff = after["cont_head.2.bias"] - before["cont_head.2.bias"]
    assert diff[2 * ACTION_NAMES.index("mem")] == pytest.approx(0.5)
    assert int((diff != 0).sum()) == 1


def test_the_search_walks_to_a_better_shift_and_keeps_only_gains(
    champion: GNNScheduler,
) -> None:
    start = {k: _shift(champion.model, k) for k in ("cpu", "mem")}

    def score(model: ActorCritic) -> Scored:  # best at mem +0.6, cpu -0.2 from the start
        mem = _shift(model, "mem") - start["mem"]
        cpu = _shift(model, "cpu") - start["cpu"]
        return Scored(1.0 + (mem - 0.6) ** 2 + (cpu + 0.2) ** 2, 1.0)

    cfg = HeadSearchSettings(step=0.4, min_step=0.1, max_evals=40, min_gain=0.0)
    res = search_shifts(champion.model, score, cfg)
    assert res.moved["mem"] == pytest.approx(0.6) and res.moved["cpu"] == pytest.approx(-0.2)
    assert res.best.jct_s == pytest.approx(1.0) and res.start.jct_s == pytest.approx(1.4)
    kept = [t["jct_s"] for t in res.trace if t["kept"]]
    assert kept == sorted(kept, reverse=True) and len(kept) < res.evals
    assert _shift(res.model, "mem") - start["mem"] == pytest.approx(0.6)


def test_a_search_that_finds_nothing_moves_nothing(champion: GNNScheduler) -> None:
    res = search_shifts(champion.model, lambda m: Scored(1.0, 1.0), HeadSearchSettings(max_evals=5))
    assert res.moved == {} and res.evals == 5 and res.gain == 0.0
    assert all(torch.equal(a, b) for a, b in zip(
        res.model.state_dict().values(), champion.model.state_dict().values(), strict=True
    ))  # fmt: skip


def test_a_search_told_to_stop_stops_before_its_next_candidate(champion: GNNScheduler) -> None:
    scored: list[int] = []

    def score(model: ActorCritic) -> Scored:
        scored.append(1)
        return Scored(1.0, 1.0)

    with pytest.raises(SearchStopped):
        search_shifts(champion.model, score, HeadSearchSettings(max_evals=16),
                      stop=lambda: len(scored) >= 3)  # fmt: skip
    assert len(scored) == 3  # the start and two candidates; no candidate after the word


def test_the_loops_search_round_restores_a_starved_memory_margin_from_the_recorded_windows(
    champion: GNNScheduler,
) -> None:
    """With the replay judge, a due round searches the champion's shifts on the newest closed
    windows. A champion whose memory means sit far below heft_history's loses most deadlines
    to OOM kills; the challenger the search keeps raises its memory shift back, and differs
    from it by that move only."""
    starved = GNNScheduler(with_shifts(champion.model, {"mem": -3.0}), champion.normalizer, "v1")
    sc = replace(small_scenario(workflows=60), drift=None)
    ev = _small_windows(min_replays=4)
    search = HeadSearchSettings(heads=("mem",), step=1.5, min_step=1.5, max_evals=3)
    cfg = LoopConfig(every_n=40, evaluator=ev, learner="search", search=search)
    loop = SimLoop(starved, cfg, seed=5)
    loop.run(loop.simulator(sc, generate_workflows(sc, 5), 5))
    rounds = [e for e in loop.events if e.kind == "round"]
    assert rounds, "no search round made a version"
    first = rounds[0]
    assert first.detail["windows"] == [0]  # the first closed window, as soon as it closed
    assert first.detail["search/jct_s"] < first.detail["search/start_jct_s"]
    assert first.detail["search/sla"] > first.detail["search/start_sla"]
    moved = first.detail["search/shift_mem"]
    assert moved > 0
    tuned, base = loop.versions[first.version].model, starved.model
    assert _shift(tuned, "mem") == pytest.approx(_shift(base, "mem") + moved)
    assert all(  # everything else as it was
        torch.equal(a, b)
        for k, (a, b) in enumerate(zip(
            tuned.state_dict().values(), base.state_dict().values(), strict=True
        ))
        if list(tuned.state_dict())[k] != "cont_head.2.bias"
    )  # fmt: skip
    searched = {tuple(e.detail["windows"]) for e in loop.events if e.kind in ("round", "search")}
    assert len(searched) == len([e for e in loop.events if e.kind in ("round", "search")])


def test_a_faster_move_that_loses_sla_is_not_kept(champion: GNNScheduler) -> None:
    """Failing workflows early can shorten a mean JCT: the search keeps no move that costs
    more SLA than `max_sla_loss`."""
    start = _shift(champion.model, "mem")

    def score(model: ActorCritic) -> Scored:  # lower memory: faster, and deadlines lost
        lower = start - _shift(model, "mem")
        return Scored(1.0 - 0.1 * lower, 0.9 - 0.05 * max(lower, 0.0))

    cfg = HeadSearchSettings(heads=("mem",), step=0.4, min_step=0.4, max_sla_loss=0.01)
    assert search_shifts(champion.model, score, cfg).moved == {}
    loose = cfg.model_copy(update={"max_sla_loss": 0.05})
    assert search_shifts(champion.model, score, loose).moved == {"mem": pytest.approx(-0.8)}


def test_a_move_that_wins_on_the_mean_but_not_play_by_play_is_not_kept(
    champion: GNNScheduler,
) -> None:
    """A best of many candidates wins a few replays on noise: a move that shortens the mean
    by one lucky play, and lengthens the others, is not kept; one that wins every play is."""
    start = _shift(champion.model, "mem")

    def lucky(model: ActorCritic) -> Scored:  # raising memory: one play far shorter
        up = _shift(model, "mem") > start + 1e-9
        per = (500.0, 1020.0, 1030.0, 1010.0) if up else (1000.0,) * 4
        return Scored(float(sum(per) / 4), 1.0, per)

    def steady(model: ActorCritic) -> Scored:  # raising memory: every play 5% shorter
        up = _shift(model, "mem") > start + 1e-9
        per = (950.0, 948.0, 953.0, 951.0) if up else (1000.0,) * 4
        return Scored(float(sum(per) / 4), 1.0, per)

    cfg = HeadSearchSettings(heads=("mem",), step=0.4, min_step=0.4, confidence=0.9)
    assert search_shifts(champion.model, lucky, cfg).moved == {}
    assert search_shifts(champion.model, lucky, cfg.model_copy(update={"confidence": 0.0})).moved
    assert search_shifts(champion.model, steady, cfg).moved == {"mem": pytest.approx(0.4)}


def _small_windows(min_replays: int) -> EvaluatorSettings:
    """The replay judge on windows of 15 workflows, 2 replays each, fidelity never refused;
    no verdict before `min_replays` paired differences."""
    replay = EvaluatorSettings().replay.model_copy(update={
        "window_workflows": 15, "warmup_workflows": 10, "replays": 2,
        "min_replays": min_replays, "fidelity_max_jct_err": 10.0,
    })  # fmt: skip
    return EvaluatorSettings(judge="replay", replay=replay)


def _superseding_run(champion: GNNScheduler, proposed: dict[str, float]) -> tuple[SimLoop, str]:
    """A loop whose champion has its memory margin starved, with a challenger (the champion's
    shifts moved by `proposed`) under test from the start; the judge never decides."""
    starved = GNNScheduler(with_shifts(champion.model, {"mem": -3.0}), champion.normalizer, "v1")
    sc = replace(small_scenario(workflows=60), drift=None)
    ev = _small_windows(min_replays=400)
    search = HeadSearchSettings(heads=("mem",), step=1.5, min_step=1.5, max_evals=3, supersede=True)
    cfg = LoopConfig(every_n=40, evaluator=ev, learner="search", search=search)
    loop = SimLoop(starved, cfg, seed=5)
    held = loop.propose(with_shifts(starved.model, proposed), 0.0)
    loop.run(loop.simulator(sc, generate_workflows(sc, 5), 5))
    return loop, held


def test_a_challenger_the_fresher_windows_show_wrong_is_replaced_by_their_move(
    champion: GNNScheduler,
) -> None:
    """A challenger under test that starves memory further loses to its champion on the
    windows that close after it; a due round searches those windows, and the move it finds
    (memory back up) replaces the challenger, having beaten it there."""
    loop, held = _superseding_run(champion, {"mem": -1.0})
    superseding = [e for e in loop.events if e.detail.get("superseded") == held]
    assert len(superseding) == 1
    e = superseding[0]
    assert e.kind == "round" and e.detail["search/shift_mem"] > 0
    assert e.detail["search/jct_s"] < e.detail["search/rival_jct_s"]
    assert loop.challenger != held


def test_a_challenger_that_beats_its_champion_is_left_to_its_test(
    champion: GNNScheduler,
) -> None:
    """The same run with the search's own move under test: no round replaces it."""
    loop, held = _superseding_run(champion, {"mem": 1.5})
    assert not [e for e in loop.events if e.kind == "round" and e.version != held]
    assert loop.challenger == held
