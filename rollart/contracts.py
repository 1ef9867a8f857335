"""What crosses process boundaries: every activity's name and the messages workflows, activities
and clients exchange (payloads and query results). It imports no logic, so the caller and the
callee of an activity both take its name and types from here.

Messages stay small on purpose: token data never travels through Temporal, only trajectory ids
and per-turn text deltas; the token ids themselves live in the trajectory store.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field, computed_field

from rollart.config import (
    AlgorithmConfig,
    EnvTimeouts,
    InjectedFaults,
    RewardConfig,
    RoutingConfig,
    RunConfig,
    SamplingConfig,
)
from rollart.queues import pool_queue

TrajectoryStatus = Literal["completed", "failed", "cancelled"]


class Activity:
    """Activity type names. They are in every recorded history: renaming one breaks replay."""

    ENV_CHECK = "env.check"
    ENV_RESET = "env.reset"
    ENV_STEP = "env.step"
    ENV_STEP_BATCH = "env.step_batch"
    ENV_CLOSE = "env.close"
    ENV_RESTORE = "env.restore"
    GEN_ROUTE = "gen.route"
    GEN_RELEASE = "gen.release"
    GEN_GENERATE = "gen.generate"
    GEN_GENERATE_BATCH = "gen.generate_batch"
    GEN_PING = "gen.ping"
    GEN_UPDATE_WEIGHTS = "gen.update_weights"
    REWARD_CHECK = "reward.check"
    REWARD_COMPUTE = "reward.compute"
    TRAIN_BEGIN_RUN = "train.begin_run"
    TRAIN_STEP = "train.step"


class TrajectorySpec(BaseModel):
    trajectory_id: str
    group_id: str
    domain: str = ""
    seed: int
    env_name: str
    env_kwargs: dict[str, object] = Field(default_factory=dict)
    max_turns: int
    env_queue: str
    gen_pools: list[tuple[str, int]] = Field(
        description="(pool, replicas) to route generation to: the domain's pool, then fallbacks.")
    reward_queue: str
    store_dir: str
    sampling: SamplingConfig
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    env_timeouts: EnvTimeouts = Field(default_factory=EnvTimeouts)
    max_observation_chars: int = 65536
    faults: InjectedFaults = Field(default_factory=InjectedFaults)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    start_version: int = Field(0, description="Rollout policy version when this one started.")
    report_to: str = Field("", description="The training workflow a trajectory that is not its "
                           "child reports to: a lockstep batch's member re-run on its own.")

    @classmethod
    def for_domain(cls, config: RunConfig, domain: str, trajectory_id: str, group_id: str,
                   seed: int, start_version: int = 0) -> TrajectorySpec:
        """The spec of one trajectory of `domain` under `config`: its env, pools and sampling."""
        task = config.domains[domain]
        sampling = config.sampling
        if task.max_tokens_per_turn is not None:
            sampling = sampling.model_copy(update={"max_tokens_per_turn":
                                                   task.max_tokens_per_turn})
        return cls(
            trajectory_id=trajectory_id, group_id=group_id, domain=domain, seed=seed,
            env_name=task.env, env_kwargs=task.kwargs, max_turns=task.max_turns,
            env_queue=pool_queue("env", task.pool),
            gen_pools=[(p.name, p.replicas) for p in config.gen_pools(task)],
            reward_queue=pool_queue("reward", task.reward_pool),
            store_dir=str(config.store_dir), sampling=sampling, routing=config.routing,
            env_timeouts=task.timeouts, max_observation_chars=task.max_observation_chars,
            faults=task.faults, reward=task.reward, start_version=start_version,
        )


class EnvResetRequest(BaseModel):
    trajectory_id: str
    env_name: str
    env_kwargs: dict[str, object] = Field(default_factory=dict)
    seed: int
    domain: str = Field("", description="The config's name for it (a metrics label).")
    faults: InjectedFaults = Field(default_factory=InjectedFaults)
    max_observation_chars: int = 65536


class EnvResetResult(BaseModel):
    observation: str
    worker_queue: str = Field(description="Queue of the env worker that holds this env's state.")
    action_vocabulary: list[str] | None = None
    answer_alphabet: list[str] | None = None
    answer_length: int | None = None
    deterministic: bool = Field(False, description="The env declares that its seed and actions "
                                "determine it: it can be rebuilt on another worker.")


class EnvRestoreRequest(EnvResetRequest):
    """Rebuild a deterministic env whose worker is gone: reset with the same seed and take the
    trajectory's actions again."""

    actions: list[str]


class EnvStepRequest(BaseModel):
    trajectory_id: str
    action: str
    faults: InjectedFaults | None = Field(None, description="None: no injected trouble (it "
                                          "would cost ~200 bytes of history every turn).")
    max_observation_chars: int = 65536


class EnvStepResult(BaseModel):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, object] = Field(default_factory=dict)
    seconds: float = Field(0.0, description="The step's own time on the env worker (injected "
                           "latency included, queueing not).")


class EnvStepBatch(BaseModel):
    """One step of several envs held by the same worker, in one activity: a lockstep batch's
    turn costs the server one activity per env worker instead of one per trajectory."""

    steps: list[EnvStepRequest]
    attempts: int = Field(0, ge=0, description="The retry policy's attempts: the last one "
                          "answers each step that still fails or hangs as a failure of its own, "
                          "so one env does not fail the others' turn; 0: every failure raises.")


class EnvStepFailure(BaseModel):
    type: str = Field(description="The error's type, e.g. EnvironmentError or EnvStepTimeout.")
    message: str


class EnvStepBatchResult(BaseModel):
    results: list[EnvStepResult | None] = Field(description="In the order of the steps; None "
                                                "where the step failed.")
    failures: list[EnvStepFailure | None] = Field(
        default_factory=list, description="In the order of the steps where any failed; empty "
        "when none did.")


class GenerateRequest(BaseModel):
    trajectory_id: str
    turn: int
    observation: str
    request_id: str = Field("", description="This attempt's id, unique per trajectory, turn and "
                            "attempt (the engine's request id).")
    after: str | None = Field(None, description="The request whose result ended the context "
                              "(the previous turn's): a replica that served it holds the "
                              "context and reads nothing from the store.")
    store_dir: str
    sampling: SamplingConfig
    action_vocabulary: list[str] | None = None
    answer_alphabet: list[str] | None = None
    answer_length: int | None = Field(
        None, description="Sample exactly this many alphabet tokens (no end token).")


CONTEXT_FULL = "context_full"
"""`GenerateResult.finish_reason` of a turn whose prompt left no room to generate."""


class GenerateResult(BaseModel):
    text: str
    prompt_tokens: int
    new_tokens: int
    cached_tokens: int
    finish_reason: str
    version: int = Field(description="Version that sampled the turn's last token.")
    mixed_versions: bool = False
    replica: str = Field("", description="The replica queue that served the turn.")
    request_id: str = ""
    prefill_s: float = Field(0.0, description="Engine seconds the turn's prefill used (its "
                             "share of a busy engine; rollart.policy.engine.Sample).")
    decode_s: float = Field(0.0, description="Engine seconds its decoding used.")


class GenerateBatch(BaseModel):
    """Turns of several trajectories for one replica, in one activity (a lockstep batch's turn);
    its engine batches them as it would separate requests."""

    requests: list[GenerateRequest]


class GenerateBatchResult(BaseModel):
    results: list[GenerateResult] = Field(description="In the order of the requests.")


class RouteRequest(BaseModel):
    request_id: str
    trajectory_id: str
    group_id: str
    context_tokens: int = 0
    pools: list[tuple[str, int]]
    """(pool name, replicas), the domain's pool first, then its fallbacks."""
    routing: RoutingConfig


class RouteDecision(BaseModel):
    queue: str
    pool: str
    replica: int
    fallback: bool
    reason: str


RouteOutcome = Literal["ok", "busy", "unreachable", "failed", "cancelled"]
"""busy: the replica did not serve in time but answers pings (its queue is full); unreachable:
it does not answer at all."""


class ReleaseRequest(BaseModel):
    request_id: str
    outcome: RouteOutcome
    down_s: float = 10.0


class RewardRequest(BaseModel):
    trajectory_id: str
    env_name: str
    env_rewards: list[float]
    final_info: dict[str, object] = Field(default_factory=dict)
    domain: str = ""
    reward: RewardConfig = Field(default_factory=RewardConfig)
    prompt: str = Field("", description="The episode's first observation.")
    actions: list[str] = Field(default_factory=list, description="The policy's text, each turn.")


class RewardResult(BaseModel):
    reward: float
    success: bool
    kind: str = "rule"
    compute_s: float = Field(0.0, description="The last attempt's time in the scorer.")
    queue_s: float = Field(0.0, description="The last attempt's wait for a reward slot.")
    attempt: int = 1
    latency_s: float = Field(0.0, description="From the trajectory's end to its reward (set by "
                             "the workflow: queueing, retries and scoring).")
    remote_s: float = Field(0.0, description="The endpoint's own compute, when its answer "
                            "says (`compute_s`): the rest of compute_s is remote overhead.")

    def for_trajectory(self) -> dict[str, object]:
        return {"reward": self.reward, "success": self.success, "reward_kind": self.kind,
                "reward_latency_s": self.latency_s, "reward_queue_s": self.queue_s,
                "reward_compute_s": self.compute_s, "reward_remote_s": self.remote_s}


class PoolUsage(BaseModel):
    """What one trajectory's turns asked of one generation pool and how long the pool took:
    the online profiler's observations."""

    turns: int = 0
    prefill_tokens: int = Field(0, description="Prompt tokens not served from a prefix cache.")
    decode_tokens: int = 0
    prefill_s: float = Field(0.0, description="Engine seconds of prefill, summed over turns.")
    decode_s: float = Field(0.0, description="Engine seconds of decoding, summed over turns.")

    def add(self, result: GenerateResult) -> None:
        self.turns += 1
        self.prefill_tokens += max(result.prompt_tokens - result.cached_tokens, 0)
        self.decode_tokens += result.new_tokens
        self.prefill_s += result.prefill_s
        self.decode_s += result.decode_s


class TrajectoryResult(BaseModel):
    """A reference to a finished trajectory: where its tokens are, plus the scalars to batch it."""

    trajectory_id: str
    group_id: str
    domain: str = ""
    status: TrajectoryStatus
    reward: float = 0.0
    success: bool = False
    turns: int = 0
    generated_tokens: int = 0
    start_version: int = 0
    end_version: int = -1
    mixed_versions: bool = Field(False, description="Its tokens come from several versions.")
    prompt_tokens: int = 0
    cached_tokens: int = Field(0, description="Prompt tokens served from a prefix cache.")
    fallback_turns: int = Field(0, description="Turns served by a fallback generation pool.")
    rerouted_turns: int = Field(0, description="Turns sent again after their replica did not "
                                "pick them up, went silent or failed.")
    env_restores: int = Field(0, description="Times its env was rebuilt on another env worker "
                              "after its own died.")
    env_step_s: float = Field(0.0, description="Time its env steps took, retries included "
                              "(workflow time; in a lockstep batch, its batch's steps).")
    env_step_times: list[float] = Field(default_factory=list, description="Each env step's "
                                        "own seconds, as its env worker measured them.")
    gen_usage: dict[str, PoolUsage] = Field(default_factory=dict, description="By the "
                                            "generation pool that served its turns.")
    reward_kind: str = ""
    reward_latency_s: float = 0.0
    reward_queue_s: float = 0.0
    reward_compute_s: float = 0.0
    reward_remote_s: float = 0.0
    error: str | None = None
    failure: str | None = Field(None, description="'<phase>: <reason>' of a failed one, e.g. "
                                "'reward: RewardEndpointDown', to count failures by reason.")


class TrainSample(BaseModel):
    trajectory_id: str
    group_id: str
    reward: float
    turns: int | None = Field(None, description="Turns of the run that produced the result: "
                              "a re-run's store may still hold later turns of the failed run.")
    domain: str = Field("", description="The trajectory's domain (a per-domain trust region "
                        "measures each domain's KL apart).")


class TrainRequest(BaseModel):
    iteration: int
    version: int = Field(description="The version being trained on; the step publishes version+1.")
    store_dir: str
    samples: list[TrainSample]
    algorithm: AlgorithmConfig
    temperature: float


class LearningStats(BaseModel):
    """What one train step saw and did to the policy: the figures that tell a collapse from bad
    luck. Ratios are pi_old / pi_behaviour on sampled tokens (old: the trainer before the step);
    a group is stale when some of its tokens were sampled by an older version than that."""

    mean_lag: float = Field(0.0, description="Versions between the trainer and the policy that "
                            "sampled a token, averaged over sampled tokens.")
    step_kl: float = Field(description="k3 estimate of KL(pre-step || post-step) on the batch.")
    step_kept: float = Field(1.0, description="Share of the optimizer's step kept (trust region).")
    step_kl_by_domain: dict[str, float] = Field(
        default_factory=dict, description="step_kl on each domain's sampled tokens alone.")
    grad_norm: float
    entropy: float = Field(description="Mean entropy per sampled token, pre-step policy.")
    entropy_coef: float = Field(0.0, description="Weight of the entropy bonus this step.")
    ratio_p05: float
    ratio_p50: float
    ratio_p95: float
    truncated_share: float = Field(description="Sampled tokens whose ratio exceeds tis_cap.")
    low_weight_share: float = Field(description="Sampled tokens whose ratio is below 0.5.")
    fresh_groups: int
    stale_groups: int
    fresh_groups_with_signal: int = Field(description="Groups whose rewards differ.")
    stale_groups_with_signal: int


class TrainResult(BaseModel):
    version: int
    weights_prefix: str = Field("", description="Where the new version was published.")
    push_s: float = Field(0.0, description="Seconds to publish the new version's buckets.")
    weight_bytes: int = 0
    loss: float
    grad_norm: float
    clip_fraction: float
    trained_tokens: int
    logprob_mismatch: float = Field(
        description="Mean |trainer - engine| logprob on sampled tokens before the step's update."
    )
    ratio_mean: float = Field(0.0, description="Mean pi_old / pi_behaviour over sampled tokens.")
    ratio_max: float = 0.0
    kl_estimate: float = Field(0.0, description="k3 estimate of KL(behaviour || old).")
    masked_sequences: int = 0
    stale_token_share: float = Field(0.0, description="Tokens sampled by an older version.")
    mixed_version_sequences: int = 0
    learning: LearningStats | None = None
    seconds: float


class UpdateWeightsRequest(BaseModel):
    version: int
    weights_prefix: str = Field(description="The run's key prefix in the weight store.")


class ReplicaMetrics(BaseModel):
    """One generation replica between two weight updates."""

    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0
    in_flight_mean: float = Field(0.0, description="Requests inside the replica, sampled at "
                                  "each arrival.")
    in_flight_max: int = 0
    running_max: int = Field(0, description="Most requests the engine ran at once.")
    queue_depth_max: int = Field(0, description="Most requests waiting for an engine slot "
                                 "(beyond engine.max_num_seqs).")
    speculating: bool | None = Field(None, description="Whether the replica speculated when "
                                     "the period ended; None: it never does.")
    speculation_switches: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = Field(0, description="Engine steps that verified drafts.")

    @computed_field
    @property
    def cache_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @computed_field
    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.seconds if self.seconds > 0 else 0.0

    @computed_field
    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @computed_field
    @property
    def mean_accepted_length(self) -> float:
        """Tokens a verify step emitted: its accepted drafts plus the one it samples."""
        return 1 + self.accepted_tokens / self.verify_steps if self.verify_steps else 0.0


class UpdateWeightsResult(BaseModel):
    version: int
    seconds: float = Field(description="Generation suspended: the exposed part of the update.")
    pull_s: float = Field(0.0, description="Pulling the buckets, while generation went on.")
    bytes: int = 0
    from_durable: int = Field(0, description="Buckets the primary store had lost or corrupted.")
    replica: str = ""
    metrics: ReplicaMetrics = Field(default_factory=ReplicaMetrics)


class DomainMetrics(BaseModel):
    trajectories: int = 0
    success_rate: float = 0.0
    reward_mean: float = 0.0
    generated_tokens: int = 0
    turns_mean: float = 0.0
    cache_hit_rate: float = 0.0
    fallback_turns: int = 0
    rerouted_turns: int = 0
    env_step_s_p50: float = Field(0.0, description="Of its trajectories' mean env step time.")
    env_step_s_p99: float = 0.0


class RewardMetrics(BaseModel):
    """One reward kind's work for the iteration's batch. Queue depth and busy share are means
    over the iteration (Little's law: time waited or scored, over the iteration's length)."""

    trajectories: int = 0
    latency_s_p50: float = 0.0
    latency_s_p99: float = Field(0.0, description="Trajectory end to reward, retries included.")
    queue_s_p99: float = 0.0
    queue_depth_mean: float = Field(0.0, description="Rewards waiting for a slot, on average.")
    busy_share: float = Field(0.0, description="Share of its reward pools' slots spent scoring.")
    remote_overhead_s_p99: float = Field(
        0.0, description="Of endpoints that report their compute: the call's time beyond it.")


class ProfileMetrics(BaseModel):
    """The online profiler's view after an iteration (rollart.workflows.profiler)."""

    mapping: dict[str, str] = Field(description="Domain -> the pool its turns go to first.")
    recommended: dict[str, str]
    predicted_s: float | None = Field(None, description="Generation seconds per iteration the "
                                      "mapping is predicted to take (busiest pool, per replica).")
    recommended_s: float | None = None
    remapped: bool = Field(False, description="The run switched to the recommendation now.")
    pools: dict[str, dict[str, float]] = Field(default_factory=dict, description="Measured "
                                               "seconds per prefill and per decode token.")


class IterationMetrics(BaseModel):
    iteration: int
    ended_at: datetime
    version: int
    reward_mean: float
    success_rate: float
    trajectories: int
    generated_tokens: int
    rollout_s: float
    train_s: float
    weight_update_s: float
    step_s: float
    tokens_per_s: float
    loss: float
    trainer_idle_s: float = Field(0.0, description="Trainer waiting for a complete batch.")
    lag_histogram: dict[int, int] = Field(default_factory=dict)
    lag_mean: float = 0.0
    lag_max: int = 0
    stale_token_share: float = 0.0
    mixed_version_trajectories: int = 0
    ratio_mean: float = 0.0
    ratio_max: float = 0.0
    kl_estimate: float = 0.0
    learning: LearningStats | None = None
    domains: dict[str, DomainMetrics] = Field(default_factory=dict)
    rewards: dict[str, RewardMetrics] = Field(default_factory=dict, description="By kind.")
    failures: dict[str, int] = Field(
        default_factory=dict, description="Trajectories failed since the previous iteration, "
        "by '<phase>: <reason>'.")
    replicas: dict[str, ReplicaMetrics] = Field(
        default_factory=dict, description="Per replica queue, since the previous update.")
    missed_updates: list[str] = Field(
        default_factory=list, description="Replicas that did not take this update (down).")
    weight_push_s: float = 0.0
    weight_pull_s: float = Field(0.0, description="Mean over replicas, overlapped with rollout.")
    weight_exposed_s: float = Field(0.0, description="Mean over replicas of the suspension.")
    weight_bytes: int = Field(0, description="Bytes pushed plus bytes pulled by all replicas.")
    profile: ProfileMetrics | None = Field(None, description="Domain -> pool mapping, where "
                                           "a domain may use more than one pool.")


class Ledger(BaseModel):
    """Every started trajectory ends in exactly one of these buckets."""

    started: int = 0
    trained: int = 0
    failed: int = 0
    evicted: int = 0

    @property
    def in_flight(self) -> int:
        """Started and not settled yet: running, or finished and waiting for its group."""
        return self.started - self.trained - self.failed - self.evicted


class RolloutShape(BaseModel):
    """Running means of what kept and cancelled redundant siblings looked like."""

    count: int = 0
    turns: float = 0.0
    tokens: float = 0.0
    reward: float = 0.0

    def add(self, result: TrajectoryResult) -> None:
        self.count += 1
        for field, value in (("turns", result.turns), ("tokens", result.generated_tokens),
                             ("reward", result.reward)):
            mean = getattr(self, field)
            setattr(self, field, mean + (value - mean) / self.count)


class TrainingStatus(BaseModel):
    iteration: int
    iterations: int
    version: int
    done: bool
    ledger: Ledger
    history: list[IterationMetrics]
    failures: list[str] = Field(default_factory=list)
    mode: str = "sync"
    alpha: int = 0
    late_results: int = Field(0, description="Results for trajectories already settled, e.g. a "
                              "re-run whose group was trained or evicted meanwhile.")
    readmitted: int = Field(0, description="Re-runs of failed trajectories that re-entered the "
                            "buffer (and moved from failed back to in flight).")
    readmitted_ids: list[str] = Field(default_factory=list, description="Their ids.")
    redundant_kept: RolloutShape = Field(default_factory=RolloutShape)
    redundant_cancelled: RolloutShape = Field(default_factory=RolloutShape)
