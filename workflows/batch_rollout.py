"""BatchRolloutWorkflow: batch-level scheduling, the baseline trajectory-level scheduling is
measured against. Every trajectory of the batch takes each turn together (generate for all, then
step all envs), so each turn waits for the slowest environment of the batch. Started by a
TrainingWorkflow (mode lockstep, or rollout_unit batch or auto), it reports each trajectory's end
to it by signal, as TrajectoryWorkflow does; one failing trajectory fails the whole batch, which
is what lockstep means."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rollart.contracts import (
        CONTEXT_FULL,
        GenerateResult,
        PoolUsage,
        TrajectoryResult,
        TrajectorySpec,
    )
    from rollart.workflows.trajectory import (
        DONE_SIGNAL,
        close_env,
        failure_reason,
        generate_turn,
        reset_env,
        score,
        step_env,
    )


@workflow.defn
class BatchRolloutWorkflow:
    @workflow.run
    async def run(self, specs: list[TrajectorySpec]) -> list[TrajectoryResult]:
        try:
            results = await self._rollout(specs)
        except ActivityError as err:
            cause = err.cause.message if err.cause is not None else str(err)
            message = f"lockstep batch {workflow.info().workflow_id} failed: {cause}"
            await self._report([TrajectoryResult(
                trajectory_id=s.trajectory_id, group_id=s.group_id, domain=s.domain,
                status="failed", start_version=s.start_version, error=message,
                failure=failure_reason("lockstep", err)) for s in specs])
            raise ApplicationError(message, type="BatchFailed", non_retryable=True) from err
        await self._report(results)
        return results

    async def _report(self, results: list[TrajectoryResult]) -> None:
        parent = workflow.info().parent
        if parent is None:
            return
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        try:
            await asyncio.gather(*(handle.signal(DONE_SIGNAL, r) for r in results))
        except Exception:  # the parent run ended: its ledger no longer waits for these
            workflow.logger.warning("could not report batch %s to %s",
                                    workflow.info().workflow_id, parent.workflow_id)

    async def _rollout(self, specs: list[TrajectorySpec]) -> list[TrajectoryResult]:
        resets = await asyncio.gather(*(reset_env(spec) for spec in specs))
        observations = [reset.observation for reset in resets]
        rewards: list[list[float]] = [[] for _ in specs]
        infos: list[dict] = [{} for _ in specs]
        actions: list[list[str]] = [[] for _ in specs]
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
            turns = await asyncio.gather(*(
                generate_turn(specs[i], turn, observations[i], resets[i], previous[i])
                for i in active))
            gens = [gen for gen, _, _ in turns]
            for i, (gen, route, _) in zip(active, turns, strict=True):
                if gen.finish_reason != CONTEXT_FULL:
                    results[i].gen_usage.setdefault(route.pool, PoolUsage()).add(gen)
            stepping = [(i, gen) for i, gen in zip(active, gens, strict=True)
                        if gen.finish_reason != CONTEXT_FULL]
            steps = await asyncio.gather(*(
                step_env(specs[i], resets[i].worker_queue, gen.text) for i, gen in stepping))
            active = []
            for (i, gen), step in zip(stepping, steps, strict=True):
                results[i].turns += 1
                previous[i] = gen
                results[i].generated_tokens += gen.new_tokens
                results[i].prompt_tokens += gen.prompt_tokens
                results[i].cached_tokens += gen.cached_tokens
                results[i].end_version = max(results[i].end_version, gen.version)
                results[i].env_step_times.append(step.seconds)
                observations[i], infos[i] = step.observation, step.info
                actions[i].append(gen.text)
                rewards[i].append(step.reward)
                if not (step.terminated or step.truncated):
                    active.append(i)
        await asyncio.gather(*(close_env(specs[i], resets[i].worker_queue) for i in active))
        scores = await asyncio.gather(*(
            score(spec, rewards[i], infos[i], resets[i].observation, actions[i])
            for i, spec in enumerate(specs)))
        return [result.model_copy(update=reward.for_trajectory())
                for result, reward in zip(results, scores, strict=True)]
