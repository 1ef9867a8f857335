"""The reward activity: scores a finished trajectory on the reward pool.

The default rule is the sum of the environment's rewards; success is the env's own verdict when
it gives one. Rules for other environments register with `@register_reward("env name")`.
"""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from rollart.activities.heartbeat import heartbeating_thread
from rollart.contracts import Activity, RewardRequest, RewardResult

RewardRule = Callable[[RewardRequest], RewardResult]
_RULES: dict[str, RewardRule] = {}


def register_reward(env_name: str) -> Callable[[RewardRule], RewardRule]:
    def decorate(rule: RewardRule) -> RewardRule:
        _RULES[env_name] = rule
        return rule

    return decorate


def episode_return(request: RewardRequest) -> RewardResult:
    total = float(sum(request.env_rewards))
    success = bool(request.final_info.get("success", total > 0))
    return RewardResult(reward=total, success=success)


@activity.defn(name=Activity.REWARD_COMPUTE)
def compute_reward(request: RewardRequest) -> RewardResult:
    """Heartbeats while a slow rule runs: a reward worker killed mid-score is noticed after
    the heartbeat timeout, not the whole reward timeout."""
    with heartbeating_thread():
        return _RULES.get(request.env_name, episode_return)(request)
