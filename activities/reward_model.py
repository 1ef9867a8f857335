"""The `model` reward kind: an LLM judge on the reward worker's own engine.

Reward threads hand their requests to the engine's event loop, so the rewards of trajectories
that end together are in the engine at once and it batches them (continuous batching), up to
the pool's concurrency. The judge reads `reward.template` filled with the episode and answers
with one of `reward.verdicts`; the reward is the verdicts' expectation under its answer
distribution, so it is never unparseable, whatever the model."""

from __future__ import annotations

import asyncio
from concurrent.futures import TimeoutError as FutureTimeout

from temporalio.exceptions import ApplicationError

from rollart.contracts import RewardRequest, RewardResult

JUDGE_TIMEOUT_S = 50.0


class ModelJudge:
    def __init__(self, engine, loop: asyncio.AbstractEventLoop, max_prompt_tokens: int) -> None:
        self.engine, self.loop, self.max_prompt_tokens = engine, loop, max_prompt_tokens
        self._verdict_ids: dict[tuple[str, ...], list[int]] = {}

    def score(self, request: RewardRequest) -> RewardResult:
        cfg = request.reward
        words = tuple(cfg.verdicts)
        try:
            text = cfg.template.format(prompt=request.prompt, label=request.final_info.get(
                "label", ""), response=request.actions[-1] if request.actions else "")
        except (KeyError, IndexError, ValueError) as err:
            raise ApplicationError(f"reward.template: cannot fill {cfg.template!r}: {err!r} "
                                   "(fields: prompt, response, label)", type="RewardConfigError",
                                   non_retryable=True) from None
        prompt_ids = self.engine.encode(text)[-self.max_prompt_tokens:]
        future = asyncio.run_coroutine_threadsafe(
            self.engine.next_token_distribution(prompt_ids, self._ids(words)), self.loop)
        try:
            distribution = future.result(JUDGE_TIMEOUT_S)
        except FutureTimeout:
            future.cancel()
            raise ApplicationError(f"the judge gave no verdict in {JUDGE_TIMEOUT_S} s",
                                   type="JudgeTimedOut") from None
        reward = sum(p * cfg.verdicts[w] for p, w in zip(distribution, words, strict=True))
        return RewardResult(reward=reward, success=reward >= cfg.success_at)

    def _ids(self, words: tuple[str, ...]) -> list[int]:
        if words not in self._verdict_ids:
            try:
                self._verdict_ids[words] = self.engine.single_token_ids(
                    list(words), field="reward.verdicts: verdict")
            except ValueError as err:
                raise ApplicationError(str(err), type="RewardConfigError",
                                       non_retryable=True) from None
        return self._verdict_ids[words]
