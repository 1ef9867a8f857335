"""The `model` reward kind: an LLM judge on engines of the reward worker's process.

Reward threads hand their requests to an engine's event loop, so the rewards of trajectories
that end together are in the engine at once and it batches them (continuous batching), up to
the pool's concurrency. The judge reads `reward.template` filled with the episode and answers
with one of `reward.verdicts`; the reward is the verdicts' expectation under its answer
distribution, so it is never unparseable, whatever the model."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import TimeoutError as FutureTimeout

from temporalio.exceptions import ApplicationError

from rollart.contracts import RewardRequest, RewardResult

JUDGE_TIMEOUT_S = 50.0


class ModelJudge:
    """The judge engines of this process (a worker's own, or in simulated compute the replicas'
    it is colocated with); each request goes to the least loaded one."""

    def __init__(self) -> None:
        self.engines: list[tuple[object, asyncio.AbstractEventLoop]] = []

    def add_engine(self, engine, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
        """Serve verdicts on `engine` (its requests run on `loop`); returns its removal."""
        entry = (engine, loop)
        self.engines.append(entry)
        return lambda: self.engines.remove(entry)

    def score(self, request: RewardRequest) -> RewardResult:
        if not self.engines:
            raise ApplicationError("reward.kind 'model': this reward worker serves no judge (its "
                                   "pool has no model)", type="RewardConfigError",
                                   non_retryable=True)
        engine, loop = min(self.engines, key=lambda entry: entry[0].running_requests)
        cfg = request.reward
        try:
            text = cfg.template.format(
                prompt=request.prompt, response=request.actions[-1] if request.actions else "",
                actions=" ".join(request.actions), label=request.final_info.get("label", ""))
        except (KeyError, IndexError, ValueError) as err:
            raise ApplicationError(f"reward.template: cannot fill {cfg.template!r}: {err!r} "
                                   "(fields: prompt, response, actions, label)",
                                   type="RewardConfigError", non_retryable=True) from None
        try:
            verdict_ids = engine.single_token_ids(list(cfg.verdicts),
                                                  field="reward.verdicts: verdict")
        except ValueError as err:
            raise ApplicationError(str(err), type="RewardConfigError",
                                   non_retryable=True) from None
        prompt_ids = engine.encode(text)[-(engine.config.max_model_len - 1):]
        future = asyncio.run_coroutine_threadsafe(
            engine.next_token_distribution(prompt_ids, verdict_ids), loop)
        try:
            distribution = future.result(JUDGE_TIMEOUT_S)
        except FutureTimeout:
            future.cancel()
            raise ApplicationError(f"the judge gave no verdict in {JUDGE_TIMEOUT_S} s",
                                   type="JudgeTimedOut") from None
        reward = sum(p * value for p, value in zip(distribution, cfg.verdicts.values(),
                                                   strict=True))
        return RewardResult(reward=reward, success=reward >= cfg.success_at)


JUDGE = ModelJudge()
