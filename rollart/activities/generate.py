"""Generation activities, served by one replica's vLLM engine.

A turn reads the trajectory's context from the store, appends the new observation's tokens,
samples, and writes the turn back (ids, behaviour logprobs, the policy version). Only the decoded
text goes back into the workflow history.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

from rollart.contracts import (
    GenerateRequest,
    GenerateResult,
    UpdateWeightsRequest,
    UpdateWeightsResult,
)
from rollart.policy.engine import PolicyEngine
from rollart.store import TrajectoryStore, TurnRecord
from rollart.workflows.trajectory import CONTEXT_FULL

T = TypeVar("T")


async def _heartbeating(work: Awaitable[T], every_s: float = 1.0) -> T:
    """Await `work` while heartbeating, so a cancelled trajectory's cancel reaches this activity;
    cancelling `work` makes vLLM abort the request."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class GenerateActivities:
    def __init__(self, engine: PolicyEngine) -> None:
        self.engine = engine

    @activity.defn(name="gen.generate")
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        engine, sampling = self.engine, request.sampling
        store = TrajectoryStore(request.store_dir)
        observation_ids = engine.encode(request.observation)
        context = store.context_ids(request.trajectory_id, request.turn) + observation_ids
        allowed = None
        if sampling.constrain_to_actions and request.action_vocabulary:
            allowed = engine.single_token_ids(request.action_vocabulary)
        max_tokens = 1 if allowed else sampling.max_tokens_per_turn
        if len(context) + max_tokens > engine.config.max_model_len:
            return GenerateResult(text="", prompt_tokens=len(context), new_tokens=0,
                                  cached_tokens=0, finish_reason=CONTEXT_FULL,
                                  version=engine.version)
        info = activity.info()
        sample = await _heartbeating(engine.generate(
            context, max_tokens=max_tokens, temperature=sampling.temperature,
            allowed_token_ids=allowed,
            request_id=f"{request.trajectory_id}.{request.turn}.{info.attempt}",
        ))
        store.write_turn(request.trajectory_id, TurnRecord(
            turn=request.turn, observation_ids=observation_ids, sampled_ids=sample.token_ids,
            logprobs=sample.logprobs, versions=sample.versions, allowed_ids=allowed,
        ))
        return GenerateResult(
            text=engine.decode(sample.token_ids), prompt_tokens=len(context),
            new_tokens=len(sample.token_ids), cached_tokens=sample.cached_tokens,
            finish_reason=sample.finish_reason, version=sample.version,
            mixed_versions=len(set(sample.versions)) > 1,
        )

    @activity.defn(name="gen.update_weights")
    async def update_weights(self, request: UpdateWeightsRequest) -> UpdateWeightsResult:
        seconds = await self.engine.update_weights(request.version, request.weights_path)
        return UpdateWeightsResult(version=request.version, seconds=seconds)
