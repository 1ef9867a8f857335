"""BatchRolloutWorkflow: batch-level scheduling, the baseline trajectory-level scheduling is
measured against. Every trajectory of the batch takes each turn together (generate for all, then
step all envs), so each turn waits for the slowest environment of the batch."""

from __future__ import annotations

import asyncio

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from rollart.contracts import CONTEXT_FULL, GenerateResult, TrajectoryResult, TrajectorySpec
    from rollart.workflows.trajectory import (
        close_env,
        generate_turn,
        reset_env,
        score,
        step_env,
    )


@workflow.defn
class BatchRolloutWorkflow:
    @workflow.run
    async def run(self, specs: list[TrajectorySpec]) -> list[TrajectoryResult]:
        resets = await asyncio.gather(*(reset_env(spec) for spec in specs))
        observations = [reset.observation for reset in resets]
        rewards: list[list[float]] = [[] for _ in specs]
        infos: list[dict] = [{} for _ in specs]
        results = [TrajectoryResult(trajectory_id=s.trajectory_id, group_id=s.group_id,
                                    domain=s.domain, status="completed",
                                    start_version=s.start_version)
                   for s in specs]
        previous: list[GenerateResult | None] = [None] * len(specs)
        active = list(range(len(specs)))
        for turn in range(max(spec.max_turns for spec in specs)):
            active = [i for i in active if turn < specs[i].max_turns]
            if not active:
                break
            gens = [gen for gen, _, _ in await asyncio.gather(*(
                generate_turn(specs[i], turn, observations[i], resets[i], previous[i])
                for i in active))]
            stepping = [(i, gen) for i, gen in zip(active, gens, strict=True)
                        if gen.finish_reason != CONTEXT_FULL]
            steps = await asyncio.gather(*(
                step_env(specs[i], resets[i].worker_queue, gen.text) for i, gen in stepping))
            active = []
            for (i, gen), step in zip(stepping, steps, strict=True):
                results[i].turns += 1
                previous[i] = gen
                results[i].generated_tokens += gen.new_tokens
                results[i].end_version = max(results[i].end_version, gen.version)
                observations[i], infos[i] = step.observation, step.info
                rewards[i].append(step.reward)
                if not (step.terminated or step.truncated):
                    active.append(i)
        await asyncio.gather(*(close_env(specs[i], resets[i].worker_queue) for i in active))
        scores = await asyncio.gather(*(score(spec, rewards[i], infos[i])
                                        for i, spec in enumerate(specs)))
        for result, reward in zip(results, scores, strict=True):
            result.reward, result.success = reward.reward, reward.success
        return results
