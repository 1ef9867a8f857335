"""The reward activity: scores a finished trajectory on the reward pool.

A domain's `reward.kind` picks how. rule: a function registered with `@register_reward("env
name")`; the default is the sum of the environment's rewards, success the env's own verdict
when it gives one. http: the trajectory POSTed as JSON to an endpoint that answers with its
reward (the body and answer are documented on rollart.config.RewardConfig).
"""

from __future__ import annotations

import json
import math
import os
import urllib.error
import urllib.request
from collections.abc import Callable

from temporalio import activity
from temporalio.exceptions import ApplicationError

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


def http_reward(request: RewardRequest) -> RewardResult:
    """One POST. An endpoint that cannot be reached, times out or answers 429/5xx raises a
    retryable error (the workflow retries with backoff, then fails the trajectory naming the
    endpoint); any other status, or an answer without a numeric reward, is final."""
    spec, url = request.reward, request.reward.url
    headers = {"Content-Type": "application/json", "Idempotency-Key": request.trajectory_id}
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env)
        if not key:
            raise ApplicationError(f"reward.api_key_env: {spec.api_key_env} is not set on the "
                                   "reward worker", type="RewardConfigError", non_retryable=True)
        headers["Authorization"] = f"Bearer {key}"
    body = json.dumps({
        "trajectory_id": request.trajectory_id, "domain": request.domain,
        "env": request.env_name, "prompt": request.prompt,
        "response": request.actions[-1] if request.actions else "", "actions": request.actions,
        "env_rewards": request.env_rewards, "final_info": request.final_info,
        "label": request.final_info.get("label"),
    }).encode()
    call = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(call, timeout=spec.timeout_s) as response:
            payload = response.read()
    except urllib.error.HTTPError as err:
        retryable = err.code == 429 or err.code >= 500
        raise ApplicationError(
            f"reward endpoint {url} answered HTTP {err.code}: {err.read()[:200]!r}",
            type="RewardEndpointError", non_retryable=not retryable) from None
    except (urllib.error.URLError, OSError) as err:  # refused, unresolvable, timed out
        reason = getattr(err, "reason", err)
        raise ApplicationError(f"reward endpoint {url} is unreachable: {reason}",
                               type="RewardEndpointDown") from None
    return _parse_answer(url, payload)


def _parse_answer(url: str, payload: bytes) -> RewardResult:
    try:
        answer = json.loads(payload)
        reward = answer["reward"]
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise TypeError("reward is not a number")
        if not math.isfinite(reward):
            raise ValueError("reward is not finite")
        success = answer.get("success", reward > 0)
        if not isinstance(success, bool):
            raise TypeError("success is not a boolean")
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise ApplicationError(
            f"reward endpoint {url} answered {payload[:200]!r}: expected JSON "
            f'{{"reward": number, "success": bool}} ({err})', type="MalformedReward",
            non_retryable=True) from None
    return RewardResult(reward=float(reward), success=success)


@activity.defn(name=Activity.REWARD_COMPUTE)
def compute_reward(request: RewardRequest) -> RewardResult:
    """Heartbeats while a slow rule or endpoint runs: a reward worker killed mid-score is
    noticed after the heartbeat timeout, not the whole reward timeout."""
    with heartbeating_thread():
        if request.reward.kind == "http":
            return http_reward(request)
        return _RULES.get(request.env_name, episode_return)(request)
