"""The reward activities: score a finished trajectory on its domain's reward pool, and check a
domain's reward before a run starts.

A domain's `reward.kind` names a scorer. Built in: rule (a function registered with
`@register_reward(name)`; default the episode's return), model (an LLM judge, see
rollart.activities.reward_model), http, http_poll and lambda (see
rollart.activities.reward_remote). A plugin adds a kind, a reward model or another serverless
platform, with `@register_reward_kind(name)`: a function from RewardRequest to RewardResult
that runs on a reward worker thread, its config in `reward.options`.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities import reward_remote
from rollart.activities.heartbeat import heartbeating_thread
from rollart.activities.reward_model import JUDGE
from rollart.config import RewardConfig
from rollart.contracts import Activity, RewardRequest, RewardResult
from rollart.metrics import REWARD_SECONDS

TRACER = trace.get_tracer("rollart")
Scorer = Callable[[RewardRequest], RewardResult]
_RULES: dict[str, Scorer] = {}
_KINDS: dict[str, Scorer] = {}


def register_reward(name: str) -> Callable[[Scorer], Scorer]:
    """A rule, used by domains whose env is `name` or whose `reward.rule` is `name`."""
    def decorate(rule: Scorer) -> Scorer:
        _RULES[name] = rule
        return rule

    return decorate


def register_reward_kind(kind: str) -> Callable[[Scorer], Scorer]:
    """A way of scoring, chosen with `reward.kind = "<kind>"` (RollArt's register_serverless
    plays this part for its serverless rewards)."""
    def decorate(scorer: Scorer) -> Scorer:
        _KINDS[kind] = scorer
        return scorer

    return decorate


def episode_return(request: RewardRequest) -> RewardResult:
    total = float(sum(request.env_rewards))
    success = bool(request.final_info.get("success", total > 0))
    return RewardResult(reward=total, success=success)


@register_reward_kind("rule")
def rule_reward(request: RewardRequest) -> RewardResult:
    rule = request.reward.rule
    return (_RULES[rule] if rule else _RULES.get(request.env_name, episode_return))(request)


register_reward_kind("model")(JUDGE.score)
register_reward_kind("http")(reward_remote.http_reward)
register_reward_kind("http_poll")(reward_remote.http_poll_reward)
register_reward_kind("lambda")(reward_remote.lambda_reward)


def scorer_for(reward: RewardConfig, where: str) -> Scorer:
    """The configured scorer, or a clear error naming what is registered."""
    if reward.kind not in _KINDS:
        raise ApplicationError(
            f"{where}.kind: unknown reward kind {reward.kind!r} (registered: {sorted(_KINDS)}; "
            "a plugin adds one with @register_reward_kind)", type="UnknownReward",
            non_retryable=True)
    if reward.kind == "rule" and reward.rule and reward.rule not in _RULES:
        raise ApplicationError(
            f"{where}.rule: unknown reward rule {reward.rule!r} (registered: {sorted(_RULES)}; "
            "a plugin adds one with @register_reward)", type="UnknownReward",
            non_retryable=True)
    return _KINDS[reward.kind]


@activity.defn(name=Activity.REWARD_CHECK)
def check_reward(reward: RewardConfig, where: str) -> None:
    """Refuses a run whose domain names a kind or rule its reward pool does not know."""
    scorer_for(reward, where)


@activity.defn(name=Activity.REWARD_COMPUTE)
def compute_reward(request: RewardRequest) -> RewardResult:
    """Heartbeats while a slow scorer runs: a reward worker killed mid-score is noticed after
    the heartbeat timeout, not the whole reward timeout."""
    scorer = scorer_for(request.reward, f"domains.{request.domain}.reward")
    info = activity.info()
    queued = (info.started_time - info.current_attempt_scheduled_time).total_seconds()
    began = time.monotonic()
    with heartbeating_thread(), TRACER.start_as_current_span("rollart.reward", attributes={
            "rollart.trajectory_id": request.trajectory_id,
            "rollart.reward_kind": request.reward.kind, "rollart.attempt": info.attempt}):
        result = scorer(request)
    compute_s = time.monotonic() - began
    REWARD_SECONDS.record(compute_s, {"kind": request.reward.kind})
    return result.model_copy(update={
        "kind": request.reward.kind, "compute_s": compute_s,
        "queue_s": max(queued, 0.0), "attempt": info.attempt})
