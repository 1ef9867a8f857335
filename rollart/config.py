"""Run configuration: one pydantic model shared by the CLI, the workers and the workflows.

Everything is checked when the model is built, so a bad config fails before any process starts and
the error names the offending field (pydantic's `loc`).
"""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SecretStr, model_validator

Role = Literal["env", "gen", "reward", "train"]


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ModelConfig(StrictModel):
    path: str | None = Field(
        None, description="A Hugging Face causal-LM directory; None makes the tiny default."
    )
    seed: int = 0


class EngineConfig(StrictModel):
    max_model_len: int = Field(512, ge=16)
    kv_cache_mib: int = Field(256, ge=16, description="KV cache size per replica (MiB; per "
                              "rank, with tensor parallelism).")
    max_num_seqs: int = Field(128, ge=1)
    enforce_eager: bool = True
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="The engine's compute dtype. The trainer computes in float32; "
        "a half-precision engine samples under logprobs a little off the trainer's, which the "
        "importance ratio (algorithm.tis_cap) corrects. bfloat16 is what GPU fleets use.")
    start_method: Literal["fork", "spawn"] = Field(
        "fork", description="How the engine core process starts. fork: a copy of the "
        "generation worker, which has imported vLLM already (measured on 2 cores: first token "
        "11.8 s after start instead of 18.2, 13 s of CPU instead of 20); spawn: a fresh "
        "interpreter that imports vLLM again (what vLLM's CPU platform picks by itself).")


class SamplingConfig(StrictModel):
    temperature: float = Field(1.0, gt=0)
    max_tokens_per_turn: int = Field(8, ge=1)
    constrain_to_actions: bool = Field(
        True,
        description="Sample only the environment's action tokens (each action must be one token).",
    )
    generate_timeout_s: float = Field(
        120.0, gt=0, description="Start-to-close bound of one generate call (it heartbeats "
        "meanwhile); raise it for long answers on slow hardware.")


class InjectedFaults(StrictModel):
    """Synthetic environment trouble for tests and benchmarks: the long tail of real envs'
    latency, transient failures and hangs."""

    step_median_s: float = Field(0.0, ge=0, description="Median of lognormal step delays.")
    step_sigma: float = Field(1.0, ge=0, description="Lognormal sigma: the tail's weight.")
    slow_reset_share: float = Field(0.0, ge=0, le=1)
    slow_reset_s: float = Field(0.0, ge=0)
    step_mean_s: float = Field(0.0, ge=0, description="Mean of Gaussian step delays (truncated "
                               "at 0), RollArt's injected env latency; adds to the lognormal one.")
    step_std_s: float = Field(0.0, ge=0)
    step_failure_rate: float = Field(0.0, ge=0, le=1, description="Share of step attempts that "
                                     "fail with a transient error before touching the env.")
    reset_failure_rate: float = Field(0.0, ge=0, le=1, description="Share of reset attempts "
                                      "that fail with a transient error (after any slow reset).")
    step_hang_rate: float = Field(0.0, ge=0, le=1, description="Share of step attempts that hang "
                                  "for hang_s before touching the env.")
    hang_s: float = Field(3600.0, ge=0)


class EnvTimeouts(StrictModel):
    """Bounds on environment activities: a hung env is detected and retried with backoff."""

    reset_s: float = Field(60.0, gt=0, description="Start-to-close timeout of one reset attempt.")
    step_s: float = Field(60.0, gt=0, description="Start-to-close timeout of one step attempt.")
    pickup_s: float = Field(
        60.0, gt=0, description="A step no worker picks up in this time (the env worker holding "
        "the episode is gone) fails the trajectory instead of waiting forever.")
    heartbeat_s: float = Field(
        10.0, gt=0, description="A reset or step attempt whose worker went silent this long "
        "(the worker died mid-step) is retried; attempts heartbeat while they run.")
    attempts: int = Field(3, ge=1, description="Attempts per reset/step; the interval doubles.")
    first_retry_s: float = Field(1.0, gt=0)


REWARD_KINDS_BUILT_IN = ("rule", "model", "http", "http_poll", "lambda")


class RewardConfig(StrictModel):
    """How a domain's finished trajectories are scored, on its reward pool.

    rule: a function registered with `@register_reward(name)` (`rule`; default: the env's name,
    else the episode's return). model: an LLM judge served by the reward pool's own engine (the
    pool's `model`): `template` filled with the episode, and the reward the expectation of
    `verdicts` under the judge's next-token distribution restricted to them (each verdict one
    token). http: POST the trajectory as JSON to `url` and read {"reward": number, "success":
    bool (optional), "compute_s": the endpoint's own compute (optional; the rest of the call
    is reported as remote overhead)}. http_poll: for rewards that run for minutes, POST the
    same body and get {"job_id": ...} (or the answer at once), then GET `url/<job_id>` every
    `poll_interval_s` until it answers with the reward (202 or {"status": "pending"}: not
    yet). lambda: AWS Lambda's Invoke API through boto3 with the same body as the event. Any
    other kind is one registered with `@register_reward_kind(name)` in a plugin; `options` is
    handed to it. The body: trajectory_id, domain, env, prompt, response (the last action),
    actions, env_rewards, final_info, label; the Idempotency-Key header (http) is the
    trajectory id, so a retried reward is computed once."""

    kind: str = Field("rule", pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$",
                      description=f"One of {REWARD_KINDS_BUILT_IN} or a registered kind.")
    rule: str | None = Field(None, description="rule: the registered rule; None: the env's.")
    template: str = Field("{prompt} {response} correct?", description="model: the judge's "
                          "prompt; {prompt}, {response} (the last action), {actions} (all) "
                          "and {label} are filled in.")
    verdicts: dict[str, float] = Field(
        default_factory=lambda: {"yes": 1.0, "no": 0.0}, min_length=2,
        description="model: the judge's answer words (one token each) and their rewards.")
    success_at: float = Field(0.5, description="model: success when the reward reaches it.")
    url: str | None = Field(None, description="http, http_poll: the endpoint (http(s)://).")
    api_key_env: str | None = Field(
        None, description="http, http_poll: environment variable with a key sent as "
        "'Authorization: Bearer ...' (read by the reward worker; never stored in the config).")
    ca_file: str | None = Field(None, description="http, http_poll: the CA bundle an https "
                                "endpoint's certificate is verified against (default: the "
                                "system's, or SSL_CERT_FILE); verification is never off.")
    timeout_s: float = Field(30.0, gt=0, le=50, description="One request's timeout (within "
                             "the reward activity's own 60 s, or each poll of http_poll).")
    poll_interval_s: float = Field(2.0, gt=0, le=60, description="http_poll: between polls.")
    deadline_s: float = Field(600.0, gt=0, description="http_poll: how long one job may run.")
    function: str | None = Field(None, description="lambda: the function's name or ARN.")
    region: str = Field("us-east-1", description="lambda: the AWS region.")
    endpoint_url: str | None = Field(
        None, description="lambda: another endpoint speaking the Invoke API (a local one).")
    options: dict[str, object] = Field(default_factory=dict,
                                       description="Handed to a registered kind as is.")
    attempts: int = Field(3, ge=1, le=20, description="Tries before the trajectory fails.")
    backoff_s: float = Field(1.0, gt=0, description="First wait between tries; doubles, up "
                             "to 30 s.")

    @model_validator(mode="after")
    def _endpoint_for_remote_kinds(self) -> RewardConfig:
        if self.kind in ("http", "http_poll") and not (self.url or "").startswith(
                ("http://", "https://")):
            raise ValueError(f"reward.url: kind {self.kind!r} needs an http:// or https:// url, "
                             f"got {self.url!r}")
        if self.kind == "lambda" and not self.function:
            raise ValueError("reward.function: kind 'lambda' needs the function's name")
        return self

    def activity_timeout_s(self) -> float:
        """The reward activity's start-to-close: one request, or a whole polled job."""
        return self.deadline_s + self.timeout_s if self.kind == "http_poll" else 60.0


class DomainConfig(StrictModel):
    """A task domain: an environment, how often it is sampled, and the pools that serve it.

    `gen_pool` is the domain's hardware affinity (e.g. prefill-heavy multi-turn work on a compute
    pool, decode-heavy answers on a bandwidth pool); `gen_fallback` lists the pools its requests
    go to, in order, while that pool has no live replica.
    """

    env: str | None = Field(None, description="A registered environment; None: the domain name.")
    kwargs: dict[str, object] = Field(default_factory=dict)
    weight: float = Field(1.0, gt=0, description="Relative share of groups from this domain.")
    max_turns: int = Field(10, ge=1)
    max_tokens_per_turn: int | None = Field(
        None, ge=1, description="Overrides sampling.max_tokens_per_turn for free-text answers.")
    pool: str = "cpu"
    gen_pool: str = "cpu"
    gen_fallback: list[str] = Field(default_factory=list)
    reward_pool: str = "cpu"
    reward: RewardConfig = Field(default_factory=RewardConfig)
    max_observation_chars: int = Field(
        65536, ge=1, description="A longer observation fails its trajectory with a clear error "
        "(it would travel through the workflow history and the model's context).")
    timeouts: EnvTimeouts = Field(default_factory=EnvTimeouts)
    faults: InjectedFaults = Field(
        default_factory=InjectedFaults,
        validation_alias=AliasChoices("faults", "latency"))  # "latency": runs started earlier


class RoutingConfig(StrictModel):
    """How a generate call picks a replica (see rollart.activities.routing)."""

    policy: Literal["cache_aware", "round_robin", "least_loaded"] = "cache_aware"
    balance_abs_threshold: int = Field(
        8, ge=0, description="cache_aware: loads (requests in flight) may differ by this much "
        "before a trajectory leaves the replica that holds its prefix ...")
    balance_rel_threshold: float = Field(
        1.5, ge=1, description="... and the busiest replica must carry this many times the "
        "least busy one's load.")
    progress_tokens: int = Field(
        512, ge=1, description="cache_aware: every this many context tokens a trajectory holds "
        "on its replica add one to the imbalance it tolerates before moving.")
    schedule_to_start_s: float = Field(
        30.0, gt=0, description="A request no replica worker picks up within this is sent "
        "again; its replica is marked down only if it does not answer a ping either, and never "
        "when it is the domain's only replica (whose requests wait up to 10 minutes).")
    down_s: float = Field(10.0, gt=0, description="A replica marked down is probed again after "
                          "this; traffic returns once a probe is served.")
    remap: bool = Field(False, description="Let the online profiler move a domain to another "
                        "of its pools (gen_pool, gen_fallback) when it predicts a faster "
                        "iteration; off: it only recommends (logged, in the metrics).")
    remap_margin: float = Field(0.15, ge=0, description="remap: the predicted generation time "
                                "must beat the current mapping's by this share ...")
    remap_patience: int = Field(3, ge=1, description="... for this many iterations in a row.")
    profile_smoothing: float = Field(0.5, gt=0, le=1, description="Weight of the newest "
                                     "iteration in the profiler's moving averages.")


class AlgorithmConfig(StrictModel):
    group_size: int = Field(8, description="Siblings per GRPO group; they share one env seed.")
    batch_size: int = Field(
        64, le=1024, description="Trajectories per train step; a multiple of group_size."
    )
    iterations: int = Field(30, ge=1)
    learning_rate: float = Field(1e-3, gt=0)
    clip_eps: float = Field(0.2, gt=0)
    clip_eps_high: float | None = Field(
        None, gt=0, description="Upper clip of the ratio (DAPO's clip-higher); None: clip_eps.")
    loss_aggregation: Literal["token_mean", "sequence_mean", "signal_token_mean"] = Field(
        "token_mean", description="token_mean: the loss is averaged over the batch's sampled "
        "tokens (a long episode weighs more); sequence_mean: over each episode's tokens, then "
        "over episodes (every episode weighs the same); signal_token_mean: over the tokens of "
        "episodes whose advantage is not zero (a solved domain's groups do not dilute the "
        "others').")
    domain_sampling: Literal["weight", "signal"] = Field(
        "weight", description="How new groups are shared among domains. weight: by the "
        "domains' weights; signal: by weight times the share of each domain's recent trained "
        "groups whose rewards differed (the groups that teach), so a solved domain's share goes "
        "to the others; each keeps domain_signal_floor of its weight.")
    domain_signal_floor: float = Field(
        0.1, gt=0, le=1, description="domain_sampling signal: the least share of its weight a "
        "domain keeps, however little its groups teach.")
    minibatches: int = Field(2, ge=1)
    epochs: int = Field(
        4, ge=1, description="Passes over the batch per train step (PPO's epochs): each pass "
        "takes one optimizer step per minibatch, all clipped against the pre-step policy. "
        "Measured on FrozenLake at alpha-1 staleness (benchmarks/learning_lab.md): 4 passes "
        "reach 0.8 in a median 12 iterations, 1 pass in 21 (and not on every seed).")
    max_grad_norm: float = Field(1.0, gt=0)
    stop_at_success: float | None = Field(
        None, ge=0, le=1, description="End early once a batch's success rate reaches this."
    )
    mode: Literal["lockstep", "sync", "one_off", "async"] = Field(
        "async", description="lockstep: sync with batch-level env interaction (every "
        "trajectory of the batch takes each turn together; the baseline RollArt calls Sync); "
        "sync: alpha 0, whole batches; one_off: alpha 1, whole batches started while the "
        "previous one trains; async: groups started continuously, alpha below."
    )
    staleness: int = Field(1, ge=0, description="alpha for mode=async.")
    batch_order: Literal["fifo", "first_complete"] = Field(
        "fifo", description="fifo: a batch is the oldest groups by start order; first_complete: "
        "whichever complete first (faster, but biased toward short episodes)."
    )
    batch_policy: Literal["blocking", "streaming"] = Field(
        "blocking", description="blocking: the trainer waits for a full batch; streaming: "
        "after waiting batch_deadline_s it trains on the complete admissible groups it has, "
        "if they are at least streaming_min_share of a batch (a smaller step, less idle).")
    rollout_unit: Literal["trajectory", "batch", "auto"] = Field(
        "trajectory", description="trajectory: one workflow per trajectory, each at its own "
        "pace; batch: the groups the supply starts together take each turn together in one "
        "workflow (far fewer workflow tasks a turn, but every turn waits for their slowest env "
        "step; a failing trajectory still fails alone); auto: batch while the measured env steps "
        "make that wait at most batch_turn_overhead_s a turn, trajectory otherwise.")
    batch_turn_overhead_s: float = Field(
        0.04, ge=0, description="What orchestration costs a trajectory-level turn beyond its "
        "work, which a batch spreads over all its trajectories; the default is near a 2-core "
        "dev server's (44-48 ms, benchmarks/orchestration.md): lower it for a Temporal cluster.")
    batch_deadline_s: float = Field(5.0, gt=0)
    streaming_min_share: float = Field(0.5, gt=0, le=1)
    redundancy: int = Field(
        0, ge=0, description="Extra siblings per group; the first group_size to finish form it."
    )
    tis_cap: float | None = Field(
        2.0, gt=0, description="Truncated importance sampling: cap on pi_old / pi_behaviour."
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="Weight of an entropy bonus (mean entropy per sampled token).")
    entropy_target: float | None = Field(
        None, gt=0, description="Adaptive entropy control: while the policy's mean entropy per "
        "sampled token is below this, the bonus's weight rises by entropy_coef_step each step; "
        "above it, it falls back (not below entropy_coef). None: a fixed entropy_coef.")
    entropy_coef_step: float = Field(0.005, gt=0)
    target_kl: float | None = Field(
        0.05, gt=0, description="Trust region: a step that moves the policy further than this "
        "KL (pre-step to post-step, on the batch's tokens) is pulled back along its direction.")
    target_kl_lag_power: float = Field(
        0.0, ge=0, description="Shrink the trust region on stale data: the step's KL budget is "
        "target_kl / (1 + mean lag) ** this, the lag being how many versions behind the trainer "
        "each sampled token's policy was (0: every batch gets target_kl; 2: the step's length "
        "falls as 1 / (1 + lag), delayed SGD's stable step).")
    trust_region: Literal["batch", "domain"] = Field(
        "batch", description="What target_kl bounds: batch, the step's KL over all the batch's "
        "sampled tokens; domain, the largest of each domain's own KL, so a domain with few "
        "sampled tokens (one-token answers beside ten-turn episodes) is not moved further than "
        "the budget by a step the other domain's tokens dominate.")
    sequence_mask_threshold: float | None = Field(
        None, gt=0, description="Drop a sequence whose mean |log(pi_old / pi_behaviour)| exceeds "
        "this (sequence-level mask); None keeps all."
    )

    @property
    def alpha(self) -> int:
        return {"lockstep": 0, "sync": 0, "one_off": 1}.get(self.mode, self.staleness)

    @property
    def groups_per_batch(self) -> int:
        return self.batch_size // self.group_size

    @model_validator(mode="after")
    def _check_groups(self) -> AlgorithmConfig:
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 for GRPO, got {self.group_size}")
        if self.batch_size % self.group_size:
            raise ValueError(
                f"batch_size ({self.batch_size}) must be a multiple of group_size "
                f"({self.group_size})"
            )
        if (self.batch_size // self.group_size) % self.minibatches:
            raise ValueError(
                f"the batch's {self.batch_size // self.group_size} groups do not split into "
                f"{self.minibatches} minibatches"
            )
        return self


class TrainerConfig(StrictModel):
    pool: str = "cpu"
    threads: int | None = Field(
        None, ge=1, description="torch threads; None: half the machine's cores (at least one), "
        "since the rollout runs beside the trainer. torch's own choice, every core, measured on "
        "2 cores: a train step of the default run 4.5 s instead of 2 s.")
    heartbeat_s: float = Field(
        120.0, gt=0, description="A train step silent this long (the trainer died) is retried "
        "on a live trainer; it heartbeats after every minibatch.")
    checkpoint_every: int = Field(
        10, ge=0, description="Save model and optimizer every this many versions (0: never).")
    ranks: int = Field(
        1, ge=1, description="Data-parallel ranks (processes) of the torch trainer. Above 1 the "
        "model is sharded with FSDP2: each rank holds 1/ranks of weights, gradients and "
        "optimizer state and takes the gradient of 1/ranks of each minibatch; the steps match "
        "a single process's (tests/test_sharded_trainer.py).")
    backend: Literal["torch", "megatron"] = Field(
        "torch", description="torch: the HF model as it is. megatron: megatron-core's GPT model "
        "(Qwen3, Qwen2 and Llama layouts), converted from the HF weights and back to HF names "
        "for the engines (install rollart[megatron]); one rank.")
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="Where the trainer computes; with cuda, rank r uses cuda:r (NCCL "
        "between ranks, gloo on cpu).")


class Hardware(StrictModel):
    """One accelerator type, from its public data sheet (dense BF16, HBM bandwidth) and its
    price relative to the others."""

    dense_tflops: float = Field(gt=0)
    memory_tb_s: float = Field(gt=0)
    relative_cost: float = Field(gt=0, description="Price per GPU-hour, relative.")


def _default_hardware() -> dict[str, Hardware]:
    # NVIDIA data sheets: H800 SXM 989 dense BF16 TFLOPS, 3.35 TB/s HBM3 (the H100 SXM's
    # figures, with NVLink cut); H20 148 TFLOPS, 4.0 TB/s. Cost H20:H800 = 1:2.85 (RollArt).
    return {"h800": Hardware(dense_tflops=989, memory_tb_s=3.35, relative_cost=2.85),
            "h20": Hardware(dense_tflops=148, memory_tb_s=4.0, relative_cost=1.0)}


class SimulationConfig(StrictModel):
    """Simulated compute: generation replicas and the trainer spend time by this roofline cost
    model instead of running a model, while the Temporal server, the workflows, the buffer, the
    router and the weight path stay real. For system figures that need separate GPU clusters
    (async vs sync, hardware affinity), which one CPU host cannot provide. A replica's hardware
    is its pool's `hardware` label (examples/multitask.toml's h800 and h20 are described).
    Defaults: a Qwen3-8B-sized model."""

    enabled: bool = False
    time_scale: float = Field(
        0.1, gt=0, description="Wall seconds per simulated second (applies to compute and weight "
        "transfer; env latency is configured in wall seconds).")
    params_b: float = Field(8.0, gt=0, description="Model parameters, billions.")
    bytes_per_param: float = Field(2.0, gt=0)
    kv_bytes_per_token: float = Field(
        147456, gt=0, description="36 layers x 8 KV heads x 128 dims x (K, V) x 2 bytes.")
    token_scale: float = Field(
        32, gt=0, description="Simulated tokens per real token of prompts and of single-token "
        "env actions (a short thought and the action): the tiny tokenizer's words stand for a "
        "real prompt's tokens.")
    answer_token_scale: float = Field(
        512, gt=0, description="Simulated tokens per real token of a free-text answer (any "
        "output but a single-token action): each digit of an answer stands for a stretch of "
        "reasoning, as a math domain's long chains of thought.")
    answer_growth: float = Field(
        0.0, ge=0, description="Drift: answers lengthen by this share of answer_token_scale "
        "per policy version (reasoning that grows during training; 0: lengths stay put).")
    compute_efficiency: float = Field(0.5, gt=0, le=1, description="Share of peak FLOPS "
                                      "prefill and batched decode reach.")
    bandwidth_efficiency: float = Field(0.7, gt=0, le=1, description="Share of peak memory "
                                        "bandwidth a decode step reaches.")
    prefill_chunk: int = Field(2048, ge=1, description="Simulated prompt tokens one request "
                               "prefills per engine step (chunked prefill).")
    hardware: dict[str, Hardware] = Field(default_factory=_default_hardware)
    train_hardware: str = "h800"
    train_gpus: int = Field(
        1, ge=1, description="Sized so that training is about a quarter of a sync iteration "
        "of benchmarks/simulated.py (5.6 s of 24.7 s); more GPUs shrink what asynchrony can "
        "hide.")
    train_efficiency: float = Field(0.35, gt=0, le=1, description="MFU of the train step "
                                    "(6 x params FLOPs per trained token).")
    train_fixed_s: float = Field(20.0, ge=0, description="Per step, whatever its size: the "
                                 "old policy's logprobs, the optimizer step, gathering weights.")
    weight_link_gb_s: float = Field(25.0, gt=0, description="Trainer -> weight store -> replica "
                                    "(200 Gb/s RDMA): push and pull each move the whole model.")
    weight_load_gb_s: float = Field(20.0, gt=0, description="Host -> GPU while a replica is "
                                    "suspended (PCIe 5 x16, effective).")
    judge_prompt_tokens: float = Field(
        8192, ge=1, description="Simulated tokens a reward model (kind 'model') prefills per "
        "verdict: the whole agentic episode it reads, whatever the real judge prompt.")
    judge_tokens: float = Field(
        512, ge=1, description="Simulated tokens a reward model decodes per verdict: a "
        "generative judge reasons before it answers.")

    @model_validator(mode="after")
    def _check_hardware(self) -> SimulationConfig:
        if self.train_hardware not in self.hardware:
            raise ValueError(f"simulation.train_hardware: unknown hardware "
                             f"{self.train_hardware!r} (declared: {sorted(self.hardware)})")
        return self


class SupervisorConfig(StrictModel):
    """How `rollart train` and `rollart stack` keep their worker processes up: a worker that
    exits is started again after a backoff (doubling per recent restart), unless it crash-loops."""

    max_restarts: int = Field(5, ge=0, description="Restarts of one worker within window_s "
                              "before the run stops (a crash loop).")
    window_s: float = Field(300.0, gt=0)
    backoff_s: float = Field(1.0, ge=0, description="Wait before the first restart.")
    max_backoff_s: float = Field(30.0, ge=0)
    fork_server: bool = Field(
        True, description="Fork the generation and trainer workers from one process that "
        "imported torch, transformers and vLLM once (rollart.workers.zygote): each would spend "
        "~12 CPU-s on those imports, and a killed one comes back in its engine's start-up time. "
        "Not with simulated compute, whose workers import none of them.")


class StorageConfig(StrictModel):
    """Where trajectories, checkpoints and durable weight copies live.

    Credentials here are for the workers only: they are never serialized (so never reach a
    workflow history or a written config); leave them out to use boto3's usual chain.
    """

    url: str | None = Field(None, description="s3://bucket/prefix or a directory; None: run_dir.")
    endpoint_url: str | None = Field(None, description="S3 endpoint (SeaweedFS, MinIO, ...).")
    region: str | None = None
    access_key_id: str | None = Field(None, exclude=True, repr=False)
    secret_access_key: SecretStr | None = Field(None, exclude=True)


class WeightsConfig(StrictModel):
    """How new policy versions reach the generation replicas."""

    backend: Literal["auto", "mooncake", "local"] = Field(
        "auto", description="auto: the Mooncake store where it is installed, else local files.")
    bucket_mib: float = Field(64, gt=0, description="Target size of one weight bucket.")
    mooncake_master: str = "127.0.0.1:50051"
    mooncake_segment_mib: int = Field(512, ge=16, description="Memory each process lends the "
                                      "Mooncake store.")
    mooncake_buffer_mib: int = Field(128, ge=16)
    durable_copy: bool = Field(
        True, description="Also write each version under storage (files or S3): the fallback "
        "when the Mooncake store evicted a bucket, and what a restarted replica loads.")


class SpeculationConfig(StrictModel):
    """Speculative decoding of a generation pool: model-free SuffixDecoding (vLLM's "suffix"
    method), drafting from suffix trees over this prompt and earlier outputs (GRPO siblings and
    earlier iterations repeat each other). Each replica speculates only while it runs few
    requests: a verify step costs more compute per request, which a busy replica cannot spare."""

    method: Literal["suffix"] = "suffix"
    num_speculative_tokens: int = Field(16, ge=1, description="Most draft tokens per step.")
    max_tree_depth: int = Field(24, ge=1, description="Longest suffix matched.")
    max_cached_requests: int = Field(
        10_000, ge=0, description="Earlier outputs kept in the global tree (0: this "
        "request's prompt and output only).")
    max_spec_factor: float = Field(1.0, gt=0, description="Draft at most this many tokens per "
                                   "matched token.")
    min_token_prob: float = Field(0.1, ge=0, le=1, description="Stop a draft at a token rarer "
                                  "than this in the tree.")
    max_running_requests: Annotated[int, Field(ge=0)] | Literal["learned"] | None = Field(
        4, description="Speculate while the replica runs at most this many requests, plain "
        "decoding above; None: always; 'learned': at each load, on the side that measured more "
        "tokens per second (rollart.policy.speculation_gate).")

    def vllm_config(self) -> dict[str, object]:
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens,
                "suffix_decoding_max_tree_depth": self.max_tree_depth,
                "suffix_decoding_max_cached_requests": self.max_cached_requests,
                "suffix_decoding_max_spec_factor": self.max_spec_factor,
                "suffix_decoding_min_token_prob": self.min_token_prob}


class PoolConfig(StrictModel):
    name: str
    role: Role
    hardware: str = "cpu"
    replicas: int = Field(1, ge=1)
    speculation: SpeculationConfig | None = Field(
        None, description="gen pools: speculative decoding (None: off).")
    model: str | None = Field(
        None, description="reward pools: an LLM judge each worker of the pool serves on its own "
        "engine, for domains with reward.kind 'model' (a Hugging Face directory; 'policy': the "
        "run's model as configured, before training).")
    colocate_with: str | None = Field(
        None, description="reward pools with a model: serve the judge on this gen pool's "
        "replicas instead of workers of its own (the judge's requests share the replicas' "
        "steps; simulated compute only).")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="gen pools: devices each replica's engine shards its model "
        "over (vLLM tensor parallelism; the model's attention and KV heads must divide by it). "
        "On CPU each rank gets its own cores (VLLM_CPU_OMP_THREADS_BIND overrides).")
    concurrency: int | None = Field(
        None, ge=1, le=4096, description="env and reward pools: activities each worker runs "
        "at once, the rest wait in the queue (None: env 64, reward 16; remote rewards are "
        "mostly waiting and can take hundreds).")

    def worker_slots(self) -> int:
        """Activities one worker of the pool runs at once."""
        return self.concurrency or {"env": 64, "reward": 16}.get(self.role, 1)

    def slots(self) -> int:
        """Activities the whole pool runs at once."""
        return self.worker_slots() * self.replicas

    @model_validator(mode="after")
    def _speculation_on_gen_pools_only(self) -> PoolConfig:
        if self.speculation is not None and self.role != "gen":
            raise ValueError(f"pools: {self.role} pool {self.name!r} has a speculation table; "
                             "only gen pools speculate")
        if self.model is not None and self.role != "reward":
            raise ValueError(f"pools: {self.role} pool {self.name!r} has a model; only reward "
                             "pools serve a judge (gen pools serve the policy)")
        if self.tensor_parallel_size > 1 and self.role != "gen":
            raise ValueError(f"pools: {self.role} pool {self.name!r} sets tensor_parallel_size; "
                             "only gen pools shard their engine")
        if self.colocate_with is not None and self.model is None:
            raise ValueError(f"pools: reward pool {self.name!r} colocates a judge with gen pool "
                             f"{self.colocate_with!r} but has no model")
        return self


class TemporalConfig(StrictModel):
    """Where the Temporal server is and how to talk to it. Secrets are named, not held: the API
    key and the payload key are read from environment variables."""

    address: str = "127.0.0.1:7233"
    namespace: str = "default"
    ui_port: int = 8233
    control_queue: str = "rollart.control"
    tls: bool = Field(False, description="TLS to the server (on whenever an API key is used).")
    tls_ca_path: str | None = Field(None, description="CA of the server's certificate; None: "
                                    "the system's roots.")
    tls_cert_path: str | None = Field(None, description="Client certificate, for mTLS.")
    tls_key_path: str | None = Field(None, description="Client private key, for mTLS.")
    tls_server_name: str | None = None
    api_key_env: str | None = Field(
        None, description="Environment variable holding an API key (e.g. Temporal Cloud).")
    encryption_key_env: str | None = Field(
        None, description="Environment variable holding a base64 AES key: every payload in "
        "histories is encrypted (`rollart codec-server` lets the Web UI show them).")
    codec_endpoint: str | None = Field(
        None, description="The codec server the embedded Web UI asks to decode payloads.")
    search_attributes: bool = Field(
        True, description="Tag workflows with RollartRun, RollartDomain, ... so the Web UI finds "
        "a run's (failed) trajectories; registered in the namespace when a run starts.")
    workflow_sandbox: bool = Field(
        False, description="Run workflow code in temporalio's sandbox, which refuses "
        "non-deterministic calls at run time. It costs the control worker about a third of its "
        "CPU (each activation and each payload runs through it); the tests and the replay of "
        "recorded histories run the workflows in it, so production need not.")


class TelemetryConfig(StrictModel):
    """OpenTelemetry traces and metrics. Traces: every process of the run sends spans from the
    training workflow down to each trajectory's workflow and activities (temporalio's tracing
    interceptor), and rollart's own inside them (generate, env reset and step, reward, train
    step, weight publish, pull and load). Metrics: see rollart.metrics and dashboards/."""

    traces: Literal["off", "file", "console", "otlp"] = Field(
        "off", description="file: JSON lines in traces_file; otlp: to a collector.")
    traces_file: str | None = Field(None, description="file: where (default: "
                                    "<run_dir>/traces.jsonl, every process appending).")
    otlp_endpoint: str | None = Field(None, description="otlp: the collector's gRPC endpoint "
                                      "(default: OTEL_EXPORTER_OTLP_ENDPOINT, else "
                                      "localhost:4317).")
    metrics: Literal["off", "prometheus"] = Field(
        "off", description="prometheus: every worker serves rollart's metrics "
        "(rollart.metrics) and the Temporal SDK's on Prometheus endpoints of its own.")
    metrics_host: str = Field("127.0.0.1", description="The address they listen on.")
    metrics_port: int = Field(
        0, ge=0, le=65534, description="0: free ports, each worker announcing its two in "
        "<run_dir>/metrics/targets/ (Prometheus file discovery, scrape config beside it); "
        "else rollart's metrics on this port and the SDK's on the next (one worker per host).")


def default_pools() -> list[PoolConfig]:
    return [PoolConfig(name="cpu", role=role) for role in ("env", "gen", "reward", "train")]


class RunConfig(StrictModel):
    run_dir: str = "runs/latest"
    plugins: list[str] = Field(
        default_factory=list, description="Modules or .py files every worker imports first, so "
        "their @register_env / @register_reward classes are known (see rollart.envs.plugins).")
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    domains: dict[str, DomainConfig] = Field(
        default_factory=lambda: {"frozenlake": DomainConfig()},
        description="Task domains trained together, keyed by a name used in metrics.")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    storage: StorageConfig = Field(default_factory=StorageConfig)
    weights: WeightsConfig = Field(default_factory=WeightsConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    pools: list[PoolConfig] = Field(default_factory=default_pools)
    temporal: TemporalConfig = Field(default_factory=TemporalConfig)
    simulation: SimulationConfig = Field(default_factory=SimulationConfig)
    supervisor: SupervisorConfig = Field(default_factory=SupervisorConfig)
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig)

    @model_validator(mode="after")
    def _check_pools(self) -> RunConfig:
        declared = {(p.role, p.name) for p in self.pools}
        if len(declared) != len(self.pools):
            raise ValueError("pools: each (role, name) pair may be declared once")
        if not self.domains:
            raise ValueError("domains: at least one task domain is needed")
        for key, domain in self.domains.items():
            if domain.env is None:
                domain.env = key
            references = [("pool", "env", domain.pool), ("gen_pool", "gen", domain.gen_pool),
                          ("reward_pool", "reward", domain.reward_pool)]
            references += [("gen_fallback", "gen", name) for name in domain.gen_fallback]
            for field, role, name in references:
                if (role, name) not in declared:
                    known = sorted(p.name for p in self.pools if p.role == role)
                    raise ValueError(f"domains.{key}.{field}: unknown {role} pool {name!r} "
                                     f"(declared: {known})")
            if domain.reward.kind == "model" and self.pool(
                    "reward", domain.reward_pool).model is None:
                raise ValueError(f"domains.{key}.reward: kind 'model' needs a judge, but reward "
                                 f"pool {domain.reward_pool!r} has no model")
        for p in self.pools:
            if p.colocate_with is None:
                continue
            if ("gen", p.colocate_with) not in declared:
                raise ValueError(f"pools: reward pool {p.name!r} colocates with unknown gen pool "
                                 f"{p.colocate_with!r}")
            if not self.simulation.enabled:
                raise ValueError(f"pools: reward pool {p.name!r}: colocate_with needs "
                                 "simulation.enabled (a real colocated judge would need a second "
                                 "engine on the replica's device; give the judge its own pool)")
        if self.trainer.backend == "megatron" and self.trainer.ranks > 1:
            raise ValueError("trainer.ranks: the megatron backend runs one rank (its tensor and "
                             "pipeline parallelism is not wired); ranks > 1 is the torch "
                             "backend's FSDP2")
        if ("train", self.trainer.pool) not in declared:
            raise ValueError(f"trainer.pool: unknown train pool {self.trainer.pool!r}")
        if self.simulation.enabled:
            if self.trainer.ranks > 1:
                raise ValueError("trainer.ranks: simulated compute prices the train step by "
                                 "simulation's cost model, which holds no real trainer ranks")
            for p in self.pools:
                if p.tensor_parallel_size > 1:
                    raise ValueError(
                        f"pools: gen pool {p.name!r} sets tensor_parallel_size with simulated "
                        "compute, which prices a replica by its hardware label; describe the "
                        "whole tensor-parallel group's rates under that label instead")
                if (p.role == "gen" or (p.model and not p.colocate_with)) and (
                    p.hardware not in self.simulation.hardware):
                    raise ValueError(
                        f"pools: {p.role} pool {p.name!r} has hardware {p.hardware!r}, which "
                        f"simulation.hardware does not describe "
                        f"(declared: {sorted(self.simulation.hardware)})")
        return self

    def pool(self, role: Role, name: str) -> PoolConfig:
        return next(p for p in self.pools if p.role == role and p.name == name)

    def gen_pools(self, domain: DomainConfig) -> list[PoolConfig]:
        """The domain's generation pool, then its fallbacks, in routing order."""
        return [self.pool("gen", name) for name in dict.fromkeys(
            [domain.gen_pool, *domain.gen_fallback])]

    def serving_gen_pools(self) -> list[PoolConfig]:
        """Every generation pool some domain may send requests to (each needs weight updates)."""
        names = dict.fromkeys(p.name for d in self.domains.values() for p in self.gen_pools(d))
        return [self.pool("gen", name) for name in names]

    @property
    def storage_url(self) -> str:
        return (self.storage.url or self.run_dir).rstrip("/")

    @property
    def store_dir(self) -> str:
        """The trajectory store: a directory, or an s3:// URL."""
        return f"{self.storage_url}/trajectories"

    @property
    def checkpoint_url(self) -> str:
        return f"{self.storage_url}/checkpoints"

    @property
    def weights_url(self) -> str:
        """The durable copy of published weights."""
        return f"{self.storage_url}/weights"

    @property
    def weights_prefix(self) -> str:
        """This run's key prefix in the weight store, the same on every machine of the run: the
        shared storage URL's digest, or the run directory's name."""
        if self.storage.url:
            return f"rollart/{hashlib.sha1(self.storage.url.encode()).hexdigest()[:12]}"
        return f"rollart/{Path(self.run_dir).name}"


def load_config(path: str | Path | None = None, **overrides: object) -> RunConfig:
    """Read a TOML or JSON config (or the defaults) and apply dotted overrides like
    `algorithm.iterations=5`."""
    data: dict = {}
    if path is not None:
        text = Path(path).read_text()
        data = json.loads(text) if str(path).endswith(".json") else tomllib.loads(text)
    return RunConfig.model_validate(_overridden(data, overrides))


def parse_sets(pairs: list[str]) -> dict[str, object]:
    """`KEY=VALUE` pairs (as `--set` takes them) as dotted overrides; a value that is not JSON
    stays a string."""
    overrides: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise ValueError(f"--set expects key=value, got {pair!r}")
        try:
            overrides[key] = json.loads(raw)
        except json.JSONDecodeError:
            overrides[key] = raw
    return overrides


def with_overrides(config: RunConfig, **overrides: object) -> RunConfig:
    """`config` with dotted overrides applied, checked again as a whole."""
    return RunConfig.model_validate(_overridden(config.model_dump(mode="json"), overrides))


def _overridden(data: dict, overrides: dict[str, object]) -> dict:
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return data
