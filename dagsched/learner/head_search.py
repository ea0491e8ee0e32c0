"""Fine-tuning the actor heads by paired replay: a pattern search over their shifts.

The residual policy's continuous head moves each value heft_history chooses (CPU, memory,
retries, priority) by a learned shift in logit space. Its output bias holds one constant
shift per value: the whole policy's margin on that value, in every state. A shift the world
calls for (in a world where an OOM kill costs an hour's restart, reserving more memory than
the recommender's margin) is one such number, and a served policy acts on the Betas' means,
which PPO moves only as far as the exploration around them reaches: at the served
concentration a memory draw strays ~2% from its mean, and a round of PPO on the logs moved
the memory shift by 0.001 to 0.01 where 0.4 was worth 12% of the mean JCT
(docs/concepts/learning.md).

`search_shifts` searches those biases directly: from the current model, it tries each
value's shift up and down by a step, keeps a move that lowers the mean JCT by at least
`min_gain` without losing more than `max_sla_loss` of SLA against the start, and halves the
step once no move does. A best of 16 candidates on a few replays wins on noise alone, so
where the score gives its plays a move must also win them consistently: the one-sided lower
confidence bound (Student's t, `confidence`) of its per-play paired gain must be above
zero. A candidate is scored over recorded windows replayed with common random numbers
(`replay_score`): the same calibrated replays the judge promotes on, built only from what
serving knew, and its JCT counted as the judge counts it (a workflow that ran out of
retries at least two deadlines, so that failing early never looks fast). Everything
but the output bias of the continuous head is left bitwise as it was.

A challenger is searched on the traffic of its day; when the world moves on, its move may be
wrong for the traffic that follows, and its test then holds the learner for as long as the
judge takes to retire it. `WindowSearch.supersede` looks at each window that closes while a
challenger is under test (`learner.search.supersede`, off by default): a challenger that
does not beat its champion there is replaced by a fresher search's move that beats it
there.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import torch
from scipy import stats

from dagsched.core.bounds import ACTION_NAMES
from dagsched.learner.replay_judge import ObservedWindow, replay_seed
from dagsched.policy.model import ActorCritic
from dagsched.policy.normalizer import FeatureNormalizer
from dagsched.policy.scheduler import GNNScheduler
from dagsched.service_config import HeadSearchSettings
from dagsched.sim.config import ScenarioConfig
from dagsched.sim.replay_pool import InThread, Plays, Replays
from dagsched.sim.snapshot import PolicyOf


class Scored(NamedTuple):
    """What a candidate did over the search's replays: mean JCT as versions are judged (a
    failed workflow at least two deadlines, `ReplayResult.judged_jct_s`), and SLA; `per`,
    each play's judged JCT in the same order for every candidate (common random numbers),
    when the score has plays to pair."""

    jct_s: float
    sla: float
    per: tuple[float, ...] = ()


Score = Callable[[ActorCritic], Scored]


class SearchStopped(Exception):
    """The search was told to stop (its service is shutting down) before it ended."""


def _never() -> bool:
    return False


# added to the judge's replay seed for the search's replays: other draws than the verdict's
SEARCH_SEED_OFFSET = 7919


@dataclass
class SearchResult:
    """The searched model, the shifts it moved (name -> logit added to the bias), how the
    start and the result scored, and every candidate tried."""

    model: ActorCritic
    moved: dict[str, float]
    start: Scored
    best: Scored
    evals: int
    trace: list[dict[str, Any]] = field(default_factory=list)

    @property
    def gain(self) -> float:
        """The share of the start's mean JCT the search took off (0 when nothing moved)."""
        return 1.0 - self.best.jct_s / self.start.jct_s if self.start.jct_s > 0 else 0.0

    def metrics(self) -> dict[str, float]:
        """What a round logs (`search/...`)."""
        out = {f"search/shift_{k}": v for k, v in self.moved.items()}
        out.update({
            "search/start_jct_s": self.start.jct_s, "search/jct_s": self.best.jct_s,
            "search/start_sla": self.start.sla, "search/sla": self.best.sla,
            "search/gain": self.gain, "search/evals": float(self.evals),
        })  # fmt: skip
        return out


def _bias(model: ActorCritic) -> torch.Tensor:
    layer = model.cont_head[-1]
    assert isinstance(layer, torch.nn.Linear)
    return layer.bias


def with_shifts(model: ActorCritic, moved: dict[str, float]) -> ActorCritic:
    """A copy of `model` whose continuous head adds `moved[name]` to the shift of each named
    value, in every state (its output bias: index 2k is value k's shift)."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        bias = _bias(out)
        for name, d in moved.items():
            bias[2 * ACTION_NAMES.index(name)] += d
    return out


def search_shifts(
    model: ActorCritic,
    score: Score,
    cfg: HeadSearchSettings | None = None,
    stop: Callable[[], bool] = _never,
) -> SearchResult:
    """Pattern search over the heads' constant shifts from `model` (see the module), as
    `cfg` (`learner.search`) says. `stop` is asked before each candidate is scored (a
    candidate's replays take seconds, a search minutes): once it says so the search raises
    `SearchStopped`, so that a service shutting down does not wait for the whole search."""
    cfg = cfg or HeadSearchSettings()
    moved: dict[str, float] = dict.fromkeys(cfg.heads, 0.0)
    best = start = score(model)
    floor = start.sla - cfg.max_sla_loss
    trace: list[dict[str, Any]] = [
        {"moved": dict(moved), "jct_s": start.jct_s, "sla": start.sla, "kept": True}
    ]
    step = cfg.step
    while step >= cfg.min_step - 1e-12 and len(trace) < cfg.max_evals:
        gained = False
        for name in cfg.heads:
            for sign in (1.0, -1.0):
                if len(trace) >= cfg.max_evals:
                    break
                cand = {**moved, name: moved[name] + sign * step}
                if stop():
                    raise SearchStopped
                s = score(with_shifts(model, cand))
                kept = (
                    s.jct_s < best.jct_s * (1 - cfg.min_gain)
                    and s.sla >= floor - 1e-12
                    and consistent(s, best, cfg.confidence)
                )
                trace.append({"moved": cand, "jct_s": s.jct_s, "sla": s.sla, "kept": kept})
                if kept:
                    best, moved, gained = s, cand, True
                    break  # the other way cannot gain too; on to the next value
        if not gained:
            step /= 2
    moved = {k: v for k, v in moved.items() if v != 0.0}
    return SearchResult(with_shifts(model, moved), moved, start, best, len(trace), trace)


def consistent(cand: Scored, best: Scored, confidence: float) -> bool:
    """Whether `cand` beats `best` play by play: the one-sided lower `confidence` bound of
    the mean paired relative gain (1 - cand / best per play) is above zero. True when the
    scores hold fewer than two paired plays, or `confidence` is 0."""
    n = len(cand.per)
    if confidence <= 0 or n < 2 or len(best.per) != n:
        return True
    gain = 1.0 - np.asarray(cand.per) / np.maximum(np.asarray(best.per), 1e-9)
    sd = float(gain.std(ddof=1))
    if sd == 0.0:
        return float(gain.mean()) > 0
    return float(gain.mean()) - float(stats.t.ppf(confidence, n - 1)) * sd / np.sqrt(n) > 0


class WindowSearch:
    """A learner's search rounds over the windows it recorded (the services' learner and the
    in-process loop): each set of windows is searched once per champion, on replay seeds
    drawn apart from the judge's (`seed` is the judge's replay seed)."""

    def __init__(self, cfg: HeadSearchSettings, seed: int, replays: Replays | None = None) -> None:
        self.cfg = cfg
        self.seed = seed + SEARCH_SEED_OFFSET
        self.replays: Replays = replays if replays is not None else InThread()
        self.last: tuple[str, int] | None = None  # (champion, newest window) searched
        # (challenger, newest window) a supersession search looked at
        self.last_rival: tuple[str, int] | None = None

    def run(
        self,
        champion: str,
        sched: GNNScheduler,
        windows: Sequence[ObservedWindow],
        base: ScenarioConfig,
        stop: Callable[[], bool] = _never,
    ) -> SearchResult | None:
        """`sched` (the champion's scheduler) with its shifts searched on `windows`; None
        with nothing recorded yet, or when these windows were searched for `champion`.
        `stop`: as `search_shifts` takes it."""
        if not windows:
            return None
        key = (champion, windows[-1].index)
        if key == self.last:
            return None
        self.last = key
        score = replay_score(
            windows, base, sched.normalizer, self.cfg.replays, self.seed,
            self.cfg.warmup_workflows, self.replays,
        )  # fmt: skip
        return search_shifts(sched.model, score, self.cfg, stop)

    def supersede(
        self,
        champion: GNNScheduler,
        rival: GNNScheduler,
        windows: Sequence[ObservedWindow],
        base: ScenarioConfig,
        stop: Callable[[], bool] = _never,
    ) -> Superseding | None:
        """While `rival` (the challenger, of `champion`) is under test: the move that should
        replace it on `windows`, traffic that arrived after it was registered. Both are
        scored there first; a rival that beats its champion (by `min_gain`, play by play) is
        left to its test. Otherwise the champion's shifts are searched on these windows, and
        a found move replaces the rival when it beats the rival the same way. None when
        nothing should replace it, or these windows were looked at for this rival already."""
        if not windows:
            return None
        key = (rival.version, windows[-1].index)
        if key == self.last_rival:
            return None
        self.last_rival = key
        cfg = self.cfg
        score = replay_score(
            windows, base, champion.normalizer, cfg.replays, self.seed, cfg.warmup_workflows,
            self.replays,
        )  # fmt: skip
        start, held = score(champion.model), score(rival.model)
        if beats(held, start, cfg):
            return None
        res = search_shifts(champion.model, score, cfg, stop)
        if not res.moved or not beats(res.best, held, cfg):
            return None
        return Superseding(res, held)


@dataclass
class Superseding:
    """A search whose move beats the challenger under test on fresher windows, and how the
    challenger scored there."""

    result: SearchResult
    rival: Scored

    def metrics(self) -> dict[str, float]:
        """What the superseding round logs: the search's, and the rival's score."""
        return {
            **self.result.metrics(),
            "search/rival_jct_s": self.rival.jct_s,
            "search/rival_sla": self.rival.sla,
        }


def beats(cand: Scored, other: Scored, cfg: HeadSearchSettings) -> bool:
    """What the search asks of a kept move, asked of `cand` against `other` on the same
    plays: a mean JCT `min_gain` lower, SLA within `max_sla_loss`, and a win play by play."""
    return (
        cand.jct_s < other.jct_s * (1 - cfg.min_gain)
        and cand.sla >= other.sla - cfg.max_sla_loss - 1e-12
        and consistent(cand, other, cfg.confidence)
    )


def replay_score(
    windows: Sequence[ObservedWindow],
    base: ScenarioConfig,
    normalizer: FeatureNormalizer,
    replays: int,
    seed: int,
    warmup: int | None = None,
    replays_where: Replays | None = None,
) -> Score:
    """How a model served (deterministically) does over `replays` replays of each of
    `windows`: mean judged JCT and SLA, the same draws for every model scored (common random
    numbers). `seed` should differ from the judge's, so that the judge's draws are not the
    ones searched on. `warmup`: as `ObservedWindow.world` takes it. `replays_where`: where
    the replays run (`sim.replay_pool`; by default in this thread)."""
    worlds = [(w.index, w.world(base, warmup)) for w in windows]
    if not worlds:
        raise ValueError("no recorded window to search on")

    where: Replays = replays_where if replays_where is not None else InThread()

    def score(model: ActorCritic) -> Scored:
        policy = PolicyOf(GNNScheduler(model, normalizer, "search"), "search")
        jobs = [
            Plays(world, policy, [replay_seed(seed, index, k) for k in range(replays)])
            for index, world in worlds
        ]
        runs = [r for got in where.play_many(jobs) for r in got]
        per = tuple(r.judged_jct_s for r in runs)
        return Scored(float(np.mean(per)), float(np.mean([r.sla for r in runs])), per)

    return score
