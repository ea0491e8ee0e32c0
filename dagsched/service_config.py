"""Typed settings of the long-running parts: broker and topics, daemon, registry, training.

Plain pydantic models, nested into `dagsched.settings.Settings`; every one forbids unknown
keys. Connection endpoints are top-level settings (`kafka_bootstrap`, `redis_url`, ...) so
they read from the conventional `DAGSCHED_KAFKA_BOOTSTRAP`-style variables.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from dagsched.schemas.messages import MAX_MESSAGE_DEPTH


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TopicSettings(_Strict):
    """Topic names (before `topic_prefix`) and how many partitions the broker creates."""

    tasks: str = "dagsched.tasks"
    decisions: str = "dagsched.decisions"
    events: str = "dagsched.events"
    deadletter: str = "dagsched.deadletter"
    decisionlog: str = "dagsched.decisionlog"
    partitions: int = Field(default=6, ge=1, le=256)


class CacheSettings(_Strict):
    """What a daemon process keeps in memory across batches, each bounded (least recently used
    out, or cleared when full). Sizes and fill times: docs/operations/caches.md."""

    # decisions this replica made or read, by (task, attempt): a redelivery while Redis is
    # away gets the same decision from them. While Redis is away, a replica decides up to this
    # many tasks from memory, then holds its input in the broker until Redis answers
    decisions: int = Field(default=100_000, ge=10, le=100_000_000)
    # parsed workflows (the DAG and its message, ~18 KB), and their downward finish times
    workflows: int = Field(default=10_000, ge=10, le=10_000_000)
    # per model served: the DAG inputs of workflows seen, in task rows (~120 B each)
    dag_rows: int = Field(default=500_000, ge=1_000, le=100_000_000)
    # per model served: encoded DAGs, in task rows (4 x hidden bytes each, 256 B at hidden 64)
    encoding_rows: int = Field(default=100_000, ge=1_000, le=100_000_000)
    # per topic: record key -> partition (the producer's murmur2, in pure Python)
    partition_keys: int = Field(default=100_000, ge=100, le=100_000_000)


class DaemonSettings(_Strict):
    """The scheduling daemon's batching, limits, A/B split and reload cadence."""

    group_id: str = "dagsched-daemon"
    batch_max: int = Field(default=256, ge=1, le=10_000)
    # 0 would take what has arrived: 5 ms less at low rates for the heuristic, but the GNN,
    # with more to pay per batch, answered 1,000 tasks/s ~15 ms later at p50 (docs/results/speed.md)
    batch_wait_ms: float = Field(default=5.0, ge=0, le=10_000)
    fetch_max_wait_ms: int = Field(default=5, ge=2, le=1000)
    max_dag_tasks: int = Field(default=5000, ge=1)
    # an input record (value and key) larger than this is dead-lettered unread: what bounds the
    # memory one record can take. The broker must accept dead letters of ~4/3 of it (base64)
    max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    # JSON nested deeper than this is dead-lettered before any parser recurses into it
    max_message_depth: int = Field(default=MAX_MESSAGE_DEPTH, ge=8, le=500)
    challenger_share: float = Field(default=0.1, ge=0, le=1)
    # the exploration slice: workflows in the buckets after the challenger's, served with
    # sampled actions by the learner's @shadow when it descends from the serving champion
    # (learner.keep_learning), else by the challenger (the champion while there is none), for
    # the learner to learn from; never judged. 0: off
    explore_share: float = Field(default=0.0, ge=0, le=1)
    # the holdback slice: workflows in the buckets after the exploration slice, served by the
    # old champion (@holdback) while the guardrail watches the one the evaluator promoted, so
    # that the guardrail compares the two in the same minutes. 0: off (the guardrail then
    # compares with the old champion's record before the promotion)
    holdback_share: float = Field(default=0.1, ge=0, le=1)
    reload_poll_s: float = Field(default=5.0, gt=0)
    view_wait_ms: float = Field(default=250.0, ge=0, le=10_000)  # for events up to a request's `at`
    grace_s: float = Field(default=10.0, gt=0)
    metrics_port: int = Field(default=9464, ge=0, le=65535)
    fallback_policy: str = "least_loaded"
    observation_ttl_s: int = Field(default=7 * 24 * 3600, ge=60)
    # the redelivery window: how long a stored decision stays in Redis, so that a redelivered
    # task_ready gets the byte-identical decision back (a consumer's uncommitted batch, a
    # replica that died, a job queue asking again, a group rewound: seconds to hours). Redis
    # holds 440-504 B per decision for this long (docs/operations/event-side.md)
    decision_ttl_s: int = Field(default=3 * 3600, ge=60)
    # how long a workflow's DAG and progress stay in Redis past its last decision or event:
    # longer than its longest task runs (a child's task_ready needs the DAG). ~330 B per
    # decision for this long
    workflow_ttl_s: int = Field(default=3 * 3600, ge=60)
    # records per batch of the event updater (one script call each): a larger batch holds
    # Redis longer (~10 us per event), a smaller one costs more round trips
    events_batch_max: int = Field(default=2000, ge=1, le=100_000)
    # cap on the decision log kept in Redis for `dagsched explain` (two streams, trimmed to it
    # at every write, oldest first; also trimmed to observation_ttl_s). 0: keep none in Redis
    # (the dagsched.decisionlog topic still carries every record)
    decision_log_max_mb: float = Field(default=1024.0, ge=0, le=1_000_000)
    # torch intra-op threads of a daemon process (0: torch's default, one per core). The served
    # path is many small operations per task: on a shared 2-core host one thread ran it 5-10x
    # faster than two (bench/daemon_throughput.py); replicas scale by processes instead.
    torch_threads: int = Field(default=1, ge=0, le=256)
    caches: CacheSettings = Field(default_factory=CacheSettings)


class RegistrySettings(_Strict):
    """MLflow model registry names."""

    model_name: str = "dagsched-policy"
    experiment: str = "dagsched"


class TrainSettings(_Strict):
    """PPO hyper-parameters (CleanRL names)."""

    learning_rate: float = Field(default=3e-4, gt=0)
    gamma: float = Field(default=0.995, gt=0, le=1)
    gae_lambda: float = Field(default=0.95, ge=0, le=1)
    clip_coef: float = Field(default=0.2, gt=0)
    ent_coef: float = Field(default=0.01, ge=0)
    vf_coef: float = Field(default=0.5, ge=0)
    max_grad_norm: float = Field(default=0.5, gt=0)
    minibatch_size: int = Field(default=64, ge=1)
    update_epochs: int = Field(default=10, ge=1)
    # stop an update's epochs once the approximate KL to the rollout policy passes this
    # (CleanRL's target_kl); None: always run every epoch
    target_kl: float | None = Field(default=None, gt=0)
    max_rollout: int = Field(default=2048, ge=64)
    # decisions per simulator per update; None: min(max_rollout, 3 x mean DAG size)
    rollout_steps: int | None = Field(default=None, ge=1)
    num_envs: int = Field(default=4, ge=1)
    # learning rate of the value head (`critic`); None: learning_rate
    critic_lr: float | None = Field(default=None, gt=0)
    # False: the value loss trains the value head only, not the encoder it shares with the
    # actor, so fitting returns cannot move the policy
    value_trunk_grad: bool = True
    # after imitation, updates that train the value head alone on rollouts of the frozen
    # warm-started actor, so PPO's first advantages are not noise
    critic_warmup_updates: int = Field(default=0, ge=0)
    # divide rewards by a running standard deviation of the discounted return (per decision
    # the completion term alone ranges over two orders of magnitude)
    reward_norm: bool = False
    # False: every episode is drawn from the curriculum's last stage (the evaluation's DAG
    # sizes), as suits a warm-started policy that already places like its teacher
    curriculum: bool = True
    # every curriculum stage draws its load from this range instead of the stage's own
    load_range: tuple[float, float] | None = None
    # how advantages are estimated: "gae" (the critic's values, GAE) or "input" (input-driven
    # baselines: `num_envs` rollouts of one arrival sequence per update, each decision's
    # baseline the other rollouts' mean return-to-go at its time; `learner.input_baseline`)
    advantage: Literal["gae", "input"] = "gae"
    # weight of KL(policy || heft_history base) in the actor's loss (`model.kl_to_base`)
    kl_coef: float = Field(default=0.0, ge=0)
    # stop an update's epochs once the mean KL to the base passes this; None: no budget
    kl_budget: float | None = Field(default=None, gt=0)
    # the residuals training may move from the base; the others stay exactly at heft_history's
    # choice (node: the node scores; cpu, mem, max_retries, priority: the values' shifts)
    residuals: tuple[Literal["node", "cpu", "mem", "max_retries", "priority"], ...] = (
        "node",
        "cpu",
        "mem",
        "max_retries",
        "priority",
    )
    # workflows per training episode: a few dozen is mostly the ramp-up from an empty cluster,
    # a few hundred is the steady state the evaluation measures
    episode_workflows: int = Field(default=24, ge=1)
    # width of the network's embeddings and MLPs (`ModelConfig.hidden`)
    hidden: int = Field(default=64, ge=8, le=1024)
    # deadline slack of the training scenarios (deadline = critical path x slack), when it
    # should differ from `sim.workload.slack`: tighter deadlines make the reward's deadline
    # term speak where the default ones are always met. Evaluation keeps `sim`'s.
    deadline_slack: tuple[float, float] | None = None

    @field_validator("residuals")
    @classmethod
    def _residuals(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v or len(set(v)) != len(v):
            raise ValueError("name each residual once, at least one")
        return v

    @field_validator("load_range")
    @classmethod
    def _load_range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not 0 < v[0] <= v[1] <= 2:
            raise ValueError("must be [low, high] with 0 < low <= high <= 2")
        return v

    @field_validator("deadline_slack")
    @classmethod
    def _slack_range(cls, v: tuple[float, float] | None) -> tuple[float, float] | None:
        if v is not None and not 1 <= v[0] <= v[1]:
            raise ValueError("must be [low, high] with 1 <= low <= high")
        return v


class HeadSearchSettings(_Strict):
    """`learner.method: search`: the pattern search over the heads' constant shifts
    (`learner.head_search.SearchConfig`)."""

    heads: tuple[Literal["cpu", "mem", "max_retries", "priority"], ...] = ("cpu", "mem")
    step: float = Field(default=0.4, gt=0, le=5)  # the first step, in logit
    min_step: float = Field(default=0.1, gt=0, le=5)  # it ends when no move this size gains
    max_evals: int = Field(default=16, ge=1, le=1000)  # candidates scored, the start included
    # a kept move lowers mean JCT by this share: above the replay judge's `min_effect_jct`
    # (0.02), so that a challenger it registers is one the judge can promote
    min_gain: float = Field(default=0.03, ge=0, lt=1)
    # and keeps the replayed SLA within this of the start's
    max_sla_loss: float = Field(default=0.01, ge=0, le=1)
    replays: int = Field(default=2, ge=1, le=100)  # per recorded window, per candidate
    # a searched window's replay plays at most this many of the arrivals before it (the
    # latest), where the judge plays `evaluator.replay.warmup_workflows`: a search scores
    # many candidates, and the judge checks the move it keeps on the full warm-up. None:
    # the judge's
    warmup_workflows: int | None = Field(default=200, ge=0)
    # a kept move wins play by play: its paired gain's one-sided lower bound at this
    # confidence is above zero (0: the means alone decide)
    confidence: float = Field(default=0.9, ge=0, lt=1)
    # while a challenger is under test, each window that closes after it was registered is
    # searched too (when the challenger does not beat its champion there): a move that beats
    # the challenger there replaces it, and its test restarts. Off by default: in the
    # shifted world it replaced a pre-shift challenger 234 workflows sooner on one seed of
    # two, promoted nothing on either, and nearly doubled the loop's replay time
    supersede: bool = False

    @model_validator(mode="after")
    def _steps(self) -> HeadSearchSettings:
        if self.min_step > self.step:
            raise ValueError(f"min_step {self.min_step} is above step {self.step}")
        if not self.heads:
            raise ValueError("no heads to search")
        return self


class LearnerSettings(_Strict):
    """`dagsched learner`: joining decisions with outcomes and one fine-tuning round per
    `every_n_tasks` completed tasks (actor heads only)."""

    group_id: str = "dagsched-learner"
    every_n_tasks: int = Field(default=1000, ge=1)
    window: int = Field(default=5000, ge=1)  # replay window: the most recent transitions
    # job-queue seconds without word of an attempt, its node's heartbeats included: then the
    # default outcome
    outcome_timeout_s: float = Field(default=600.0, gt=0)
    # the longest one round (a fine-tuning or a search) may keep the learner from polling the
    # broker before its consumer group counts it gone and reads its records again (Kafka's
    # max.poll.interval): a search over large windows takes minutes
    max_round_s: float = Field(default=3600.0, gt=0)
    learning_rate: float = Field(default=1e-4, gt=0)
    clip_coef: float = Field(default=0.2, gt=0)
    ent_coef: float = Field(default=0.0, ge=0)
    max_grad_norm: float = Field(default=0.5, gt=0)
    target_kl: float = Field(default=0.02, gt=0)  # approximate KL to the champion: stop
    update_epochs: int = Field(default=4, ge=1)
    minibatch_size: int = Field(default=64, ge=1)
    # register a new challenger even while the current one is under A/B test (restarts it)
    replace_challenger: bool = False
    # while a challenger is under A/B test, due rounds go on improving a shadow of the
    # champion (alias `shadow`), which serves the exploration slice; when the evaluator ends
    # the test, the latest shadow becomes the next challenger at once. False: a due round
    # waits for the verdict
    keep_learning: bool = False
    # with keep_learning: rounds chained on the shadow before the first challenger of each
    # champion is proposed (a one-round challenger is barely different from its champion)
    min_rounds: int = Field(default=1, ge=1)
    # advantages of a round (`FinetuneConfig.credit`): "task" (an attempt's reward plus its
    # task's later attempts'), "task-critic" (the same minus the champion critic's baseline)
    # or "attempt" (one step)
    credit: Literal["task", "task-critic", "attempt"] = "task"
    # how a round fine-tunes the heads: "search": the heads' constant shifts searched by
    # paired replay of the newest windows the learner recorded (evaluator.replay's windows),
    # each candidate scored by its mean JCT (docs/concepts/learning.md); or "ppo" on the
    # window's attempts (the settings above). Search is the method that has promoted a
    # better version in the shifted world; PPO never has
    method: Literal["ppo", "search"] = "search"
    search: HeadSearchSettings = Field(default_factory=HeadSearchSettings)


class ReplaySettings(_Strict):
    """The replay judge (`learner.replay_judge`): windows, replays, the paired test, fidelity."""

    window_workflows: int = Field(default=100, ge=1)  # arrivals per window (non-overlapping)
    # earlier arrivals replayed first, uncounted: long enough to build the congestion the
    # window really met (a change that relieves it is seen only then)
    warmup_workflows: int = Field(default=400, ge=0)
    # later arrivals replayed after the window, uncounted: those that came while its
    # workflows ran, at most this many (the traffic its last workflows competed with)
    after_workflows: int = Field(default=150, ge=0)
    # replay, before the warm-up, the workflows still in flight when it began (their tasks
    # not yet finished then): on a congested cluster they hold much of its capacity
    carry_in_flight: bool = False
    replays: int = Field(default=16, ge=1)  # K per version per window (common random numbers)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    min_replays: int = Field(default=16, ge=2)  # paired differences before any verdict
    min_windows: int = Field(default=2, ge=1)  # and windows
    # the test's variance: "replays" (the gain on the traffic seen) or "windows" (the larger
    # of that and the spread between windows: the gain on traffic like it)
    variance: Literal["replays", "windows"] = "replays"
    min_windows_futile: int = Field(default=4, ge=1)  # windows before a futility retirement
    max_replays: int = Field(default=400, ge=2)  # then the challenger is retired
    tau_jct: float = Field(default=0.05, gt=0)  # mixing-prior sd of the relative JCT reduction
    tau_sla: float = Field(default=0.03, gt=0)
    tau_reward: float = Field(default=0.02, gt=0)
    min_effect_jct: float = Field(default=0.02, ge=0)  # 2% shorter mean JCT
    min_effect_sla: float = Field(default=0.01, ge=0)
    min_effect_reward: float = Field(default=0.005, ge=0)
    fidelity_max_jct_err: float = Field(default=0.15, gt=0)  # refuse above this relative error
    fidelity_windows: int = Field(default=4, ge=1)  # windows pooled for the fidelity check
    # replays of a window as it was served when a challenger's slice served part of it (they
    # measure fidelity only); None: all `replays`
    fidelity_replays: int | None = Field(default=None, ge=1)
    seed: int = 0
    # where the judge's and the learner's search replays run: 1 in the service's own thread,
    # 0 one worker process per core, N that many (a window's replays are independent)
    workers: int = Field(default=1, ge=0)


class CanarySettings(_Strict):
    """The challenger's live slice as a non-inferiority guardrail (`learner.canary`)."""

    # challenger workflows the slice must serve before a replay win can promote it
    min_workflows: int = Field(default=50, ge=1)
    # retire the challenger once its slice is significantly worse than the champion's by more
    # than this: SLA attainment in points, speed (-log(JCT / deadline)) ~ relative JCT
    margin_sla: float = Field(default=0.05, ge=0)
    margin_speed: float = Field(default=0.05, ge=0)


class EvaluatorSettings(_Strict):
    """`dagsched evaluator`: the replay judge, the canary, the guardrail and the Redis lease."""

    group_id: str = "dagsched-evaluator"
    # what promotes a challenger: "replay" (the paired replay judge's verdict and a clean
    # canary: the live slice is only a non-inferiority guardrail) or "ab" (the per-workflow
    # A/B test alone, which cannot see a gain the whole cluster shares)
    judge: Literal["replay", "ab"] = "replay"
    alpha: float = Field(default=0.05, gt=0, lt=1)
    min_samples: int = Field(default=100, ge=2)  # workflows per arm before any verdict
    max_samples: int = Field(default=5000, ge=2)  # challenger workflows: then retire
    tau_sla: float = Field(default=0.05, gt=0)  # mixing-prior sd of the SLA difference
    tau_reward: float = Field(default=0.05, gt=0)  # mixing-prior sd of the reward difference
    min_effect_sla: float = Field(default=0.02, ge=0)
    min_effect_reward: float = Field(default=0.01, ge=0)
    tau_speed: float = Field(default=0.1, gt=0)  # mixing-prior sd of the speed difference
    min_effect_speed: float = Field(default=0.03, ge=0)  # -log(JCT/deadline): ~3% sooner
    # regression adjustment (CUPED) on the workflows' slack and the congestion they met
    adjust: bool = True
    outcome_timeout_s: float = Field(default=600.0, gt=0)
    guardrail_window: int = Field(default=200, ge=2)  # new-champion workflows watched
    lease_ttl_s: float = Field(default=10.0, gt=0)
    replay: ReplaySettings = Field(default_factory=ReplaySettings)
    canary: CanarySettings = Field(default_factory=CanarySettings)
