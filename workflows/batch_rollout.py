"""BatchRolloutWorkflow: batch-level scheduling, the baseline trajectory-level scheduling is
measured against. Every trajectory of the batch takes each turn together (generate for all, then
step all envs), so each turn waits for the slowest environment of the batch. Started by a
TrainingWorkflow (mode lockstep, or rollout_unit batch or auto), it reports each trajectory's end
to it by signal, as TrajectoryWorkflow does. A trajectory whose env reset, env step or
generation fails ends failed on its own while the rest go on (histories from before batched
turns failed the batch); a deterministic env whose worker is lost is rebuilt on another, as a
trajectory's is. Each trajectory is scored and reported as it ends, not when the batch does; one
the training run drops (evicted, or redundant) stops at its next turn and ends cancelled."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from rollart.contracts import (
        CONTEXT_FULL,
        Activity,
        EnvResetResult,
        EnvStepBatch,
        EnvStepBatchResult,
        EnvStepFailure,
        EnvStepResult,
        GenerateBatch,
        GenerateBatchResult,
        GenerateResult,
        PoolUsage,
        RouteDecision,
        TrajectoryResult,
        TrajectorySpec,
    )
    from rollart.search_attributes import FAILED_IN, RUN
    from rollart.workflows.trajectory import (
        DONE_SIGNAL,
        GENERATE_HEARTBEAT,
        MAX_RESTORES,
        close_env,
        env_retry,
        env_worker_lost,
        failure_reason,
        first_pickup,
        generate_turn,
        non_retryable,
        reset_env,
        restore_env,
        score,
        step_env,
        step_request,
        sticky_replica,
        turn_request,
    )

BATCHED_TURNS = "batched-turns"
ISOLATED_FAILURES = "batch-isolated-failures"
ISOLATED_RESETS = "batch-isolated-resets"
RESTORE_LOST_ENVS = "batch-restore-lost-envs"
EARLY_REPORTS = "batch-early-reports"
DROP_SIGNAL = "drop"


class TurnFailed:
    """One trajectory's turn that failed for good: an outcome, not raised (the batch goes on)."""

    def __init__(self, phase: str, reason: str, message: str) -> None:
        self.phase, self.reason, self.message = phase, reason, message

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, phase: str, err: ActivityError) -> TurnFailed:
        cause = err.cause.message if err.cause is not None else str(err)
        return cls(phase, failure_reason(phase, err), cause)


@workflow.defn
class BatchRolloutWorkflow:
    def __init__(self) -> None:
        self.unbatched: set[str] = set()  # replica queues whose batch failed: routed one by one
        self.isolated = False  # a trajectory's failure is its own (else it fails the batch)
        self.restores: dict[int, int] = {}  # envs rebuilt after their worker was lost
        self.dropped: set[str] = set()
        self.early = False  # each trajectory is scored and reported as it ends
        self.reported: set[str] = set()
        self.tagged_failed = False

    @workflow.signal(name=DROP_SIGNAL)
    def drop(self, trajectory_ids: list[str]) -> None:
        """The training run no longer wants these (evicted as stale, or redundant siblings of
        a full group): each stops at its next turn, gives its env back and ends cancelled, as
        a cancelled TrajectoryWorkflow does."""
        self.dropped.update(trajectory_ids)

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
                failure=failure_reason("lockstep", err))
                for s in specs if s.trajectory_id not in self.reported])
            raise ApplicationError(message, type="BatchFailed", non_retryable=True) from err
        await self._report([r for r in results if r.trajectory_id not in self.reported])
        return results

    async def _report(self, results: list[TrajectoryResult]) -> None:
        self.reported.update(r.trajectory_id for r in results)
        failed = [r for r in results if r.status == "failed"]
        if (failed and not self.tagged_failed
                and workflow.info().typed_search_attributes.get(RUN) is not None):
            self.tagged_failed = True  # found as failed trajectories are, by the first phase
            phase = (failed[0].failure or "lockstep").split(":")[0]
            workflow.upsert_search_attributes([FAILED_IN.value_set(phase)])
        parent = workflow.info().parent
        if parent is None or not results:
            return
        handle = workflow.get_external_workflow_handle(parent.workflow_id)
        try:
            await asyncio.gather(*(handle.signal(DONE_SIGNAL, r) for r in results))
        except Exception:  # the parent run ended: its ledger no longer waits for these
            workflow.logger.warning("could not report batch %s to %s",
                                    workflow.info().workflow_id, parent.workflow_id)

    async def _rollout(self, specs: list[TrajectorySpec]) -> list[TrajectoryResult]:
        results = [TrajectoryResult(trajectory_id=s.trajectory_id, group_id=s.group_id,
                                    domain=s.domain, status="completed",
                                    start_version=s.start_version)
                   for s in specs]
        resets: list[EnvResetResult] = []
        active = []
        for i, reset in enumerate(await self._reset(specs)):
            if isinstance(reset, TurnFailed):
                results[i] = self._failed(specs[i], results[i], 0, reset)
                reset = EnvResetResult(observation="", worker_queue="")  # never used
            else:
                active.append(i)
            resets.append(reset)
        observations = [reset.observation for reset in resets]
        rewards: list[list[float]] = [[] for _ in specs]
        infos: list[dict] = [{} for _ in specs]
        actions: list[list[str]] = [[] for _ in specs]
        previous: list[GenerateResult | None] = [None] * len(specs)
        releases: list[asyncio.Task] = []  # failed trajectories' envs being closed meanwhile
        batched = workflow.patched(BATCHED_TURNS)
        self.isolated = batched and workflow.patched(ISOLATED_FAILURES)
        self.early = self.isolated and workflow.patched(EARLY_REPORTS)
        ends: list[asyncio.Task] = []

        def end(ended: list[int], close: bool = False) -> None:
            """These are done: each is scored (if completed) and reported now, so that its
            group need not wait for the batch's longest episode."""
            if self.early:
                ends.extend(asyncio.create_task(self._end(
                    specs[i], i, results, rewards[i], infos[i], resets[i], actions[i], close))
                    for i in ended)

        end([i for i in range(len(specs)) if i not in active])  # their env could not be opened
        for turn in range(max(spec.max_turns for spec in specs)):
            kept = self._undropped(specs, active, results, resets, releases)
            end([i for i in active if i not in kept])
            active = [i for i in kept if turn < specs[i].max_turns]
            end([i for i in kept if i not in active], close=True)
            if not active:
                break
            if batched:
                turns = await self._generate(specs, active, turn, observations, resets,
                                             previous)
            else:
                turns = await asyncio.gather(*(
                    generate_turn(specs[i], turn, observations[i], resets[i], previous[i])
                    for i in active))
            stepping, failed = [], []
            for i, done in zip(active, turns, strict=True):
                if isinstance(done, TurnFailed):
                    results[i] = self._failed(specs[i], results[i], turn, done)
                    failed.append(i)
                    continue
                gen, route, _ = done
                if gen.finish_reason != CONTEXT_FULL:
                    results[i].gen_usage.setdefault(route.pool, PoolUsage()).add(gen)
                    stepping.append((i, gen))
                else:
                    end([i], close=True)
            started = workflow.now()
            if batched:
                steps = await self._step(specs, stepping, resets, actions)
            else:
                steps = await asyncio.gather(*(
                    step_env(specs[i], resets[i].worker_queue, gen.text)
                    for i, gen in stepping))
            step_s = (workflow.now() - started).total_seconds()
            active = []
            for (i, gen), step in zip(stepping, steps, strict=True):
                if isinstance(step, TurnFailed):
                    results[i] = self._failed(specs[i], results[i], turn, step)
                    failed.append(i)
                    continue
                results[i].turns += 1
                previous[i] = gen
                results[i].generated_tokens += gen.new_tokens
                results[i].prompt_tokens += gen.prompt_tokens
                results[i].cached_tokens += gen.cached_tokens
                results[i].end_version = max(results[i].end_version, gen.version)
                results[i].env_step_times.append(step.seconds)
                results[i].env_step_s += step_s
                observations[i], infos[i] = step.observation, step.info
                actions[i].append(gen.text)
                rewards[i].append(step.reward)
                if not (step.terminated or step.truncated):
                    active.append(i)
                else:
                    end([i])
            releases += [asyncio.create_task(_give_back(specs[i], resets[i])) for i in failed]
            end(failed)
        kept = self._undropped(specs, active, results, resets, releases)
        end([i for i in active if i not in kept])
        active = kept
        if self.early:
            end(active, close=True)
            await asyncio.gather(*ends, *releases)
            return results
        await asyncio.gather(*(close_env(specs[i], resets[i].worker_queue) for i in active),
                             *releases)
        for i, restores in self.restores.items():
            results[i] = results[i].model_copy(update={"env_restores": restores})
        ended = [i for i, result in enumerate(results) if result.status == "completed"]
        scores = await asyncio.gather(*(
            score(specs[i], rewards[i], infos[i], resets[i].observation, actions[i])
            for i in ended))
        for i, reward in zip(ended, scores, strict=True):
            results[i] = results[i].model_copy(update=reward.for_trajectory())
        return results

    async def _end(self, spec: TrajectorySpec, i: int, results: list[TrajectoryResult],
                   rewards: list[float], info: dict, reset: EnvResetResult, actions: list[str],
                   close: bool) -> None:
        """Trajectory i's env given back (`close`), its reward, and its report; a reward that
        fails fails it alone."""
        if close:
            await _give_back(spec, reset)
        if i in self.restores:
            results[i] = results[i].model_copy(update={"env_restores": self.restores[i]})
        if results[i].status == "completed":
            try:
                reward = await score(spec, rewards, info, reset.observation, actions)
                results[i] = results[i].model_copy(update=reward.for_trajectory())
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                results[i] = self._failed(spec, results[i], results[i].turns,
                                          TurnFailed.of("reward", err))
        await self._report([results[i]])

    def _undropped(self, specs: list[TrajectorySpec], active: list[int],
                   results: list[TrajectoryResult], resets: list[EnvResetResult],
                   releases: list[asyncio.Task]) -> list[int]:
        """`active` less the trajectories dropped meanwhile, which end cancelled here."""
        kept = []
        for i in active:
            if specs[i].trajectory_id not in self.dropped:
                kept.append(i)
                continue
            results[i] = results[i].model_copy(update={"status": "cancelled"})
            releases.append(asyncio.create_task(_give_back(specs[i], resets[i])))
        return kept

    @staticmethod
    async def _reset(specs: list[TrajectorySpec]) -> list[EnvResetResult | TurnFailed]:
        """Every trajectory's env; one that cannot be opened fails that trajectory alone
        (histories from before this patch failed the batch)."""
        isolated = workflow.patched(ISOLATED_RESETS)

        async def one(spec: TrajectorySpec) -> EnvResetResult | TurnFailed:
            try:
                return await reset_env(spec)
            except ActivityError as err:
                if not isolated or is_cancelled_exception(err):
                    raise
                return TurnFailed.of("reset", err)

        return await asyncio.gather(*(one(spec) for spec in specs))

    @staticmethod
    def _failed(spec: TrajectorySpec, result: TrajectoryResult, turn: int,
                failed: TurnFailed) -> TrajectoryResult:
        workflow.logger.warning("trajectory %s of batch %s failed in %s (turn %d): %s",
                                spec.trajectory_id, workflow.info().workflow_id, failed.phase,
                                turn, failed)
        return result.model_copy(update={
            "status": "failed", "failure": failed.reason,
            "error": f"trajectory {spec.trajectory_id} failed in {failed.phase} "
                     f"(turn {turn}): {failed}"})

    async def _generate(self, specs: list[TrajectorySpec], active: list[int], turn: int,
                        observations: list[str], resets: list[EnvResetResult],
                        previous: list[GenerateResult | None],
                        ) -> list[tuple[GenerateResult, RouteDecision, int] | TurnFailed]:
        """The turn of every active trajectory, one activity per replica: each trajectory keeps
        its replica for the whole episode (the replica holds its context). A replica whose
        batch fails is left to the router from then on, one request at a time, as a
        trajectory's turns are (with its re-sends, pings and marking down); a batch that fails
        for good (a request it cannot serve) is retried one request at a time, so that only
        the trajectory at fault fails."""
        by_queue: dict[str, list[int]] = {}
        routed: list[int] = []
        decisions: dict[int, RouteDecision] = {}
        for i in active:
            decisions[i] = sticky_replica(specs[i], i, "batch")
            if decisions[i].queue in self.unbatched:
                routed.append(i)
            else:
                by_queue.setdefault(decisions[i].queue, []).append(i)

        async def one(i: int) -> tuple | TurnFailed:
            try:
                return await generate_turn(specs[i], turn, observations[i], resets[i],
                                           previous[i])
            except ActivityError as err:
                if not self.isolated or is_cancelled_exception(err):
                    raise
                return TurnFailed.of("generate", err)

        async def one_by_one(members: list[int]) -> dict[int, tuple | TurnFailed]:
            done = await asyncio.gather(*(one(i) for i in members))
            return dict(zip(members, done, strict=True))

        async def batch(queue: str, members: list[int]) -> dict[int, tuple]:
            requests = [turn_request(specs[i], turn, observations[i], resets[i], previous[i],
                                     f"{specs[i].trajectory_id}.{turn}.b") for i in members]
            try:
                served = await workflow.execute_activity(
                    Activity.GEN_GENERATE_BATCH, GenerateBatch(requests=requests),
                    result_type=GenerateBatchResult, task_queue=queue,
                    schedule_to_start_timeout=first_pickup(specs[members[0]]),
                    start_to_close_timeout=timedelta(seconds=max(
                        specs[i].sampling.generate_timeout_s for i in members)),
                    heartbeat_timeout=GENERATE_HEARTBEAT,
                    retry_policy=RetryPolicy(maximum_attempts=1))
            except ActivityError as err:
                if is_cancelled_exception(err) or (non_retryable(err) and not self.isolated):
                    raise
                if non_retryable(err):
                    return await one_by_one(members)
                workflow.logger.warning("batched turn %d on %s failed (%s): its trajectories "
                                        "go through the router from now on", turn, queue,
                                        err.cause or err)
                self.unbatched.add(queue)
                return await one_by_one(members)
            return {i: (result, decisions[i], 0)
                    for i, result in zip(members, served.results, strict=True)}

        parts = await asyncio.gather(one_by_one(routed),
                                     *(batch(q, members) for q, members in by_queue.items()))
        merged = {i: turn for part in parts for i, turn in part.items()}
        return [merged[i] for i in active]

    async def _step(self, specs: list[TrajectorySpec], stepping: list[tuple[int, GenerateResult]],
                    resets: list[EnvResetResult],
                    actions: list[list[str]]) -> list[EnvStepResult | TurnFailed]:
        """Every env's step, one activity per env worker holding them; a step that fails on its
        last attempt fails its own trajectory. An env whose worker is gone is rebuilt on
        another, as a trajectory's is, where it is deterministic (else it fails)."""
        by_queue: dict[str, list[tuple[int, GenerateResult]]] = {}
        for i, gen in stepping:
            by_queue.setdefault(resets[i].worker_queue, []).append((i, gen))

        async def batch(queue: str, members: list[tuple[int, GenerateResult]]) -> dict:
            timeouts = [specs[i].env_timeouts for i, _ in members]
            retry = env_retry(specs[members[0][0]])
            try:
                done = await workflow.execute_activity(
                    Activity.ENV_STEP_BATCH,
                    EnvStepBatch(steps=[step_request(specs[i], gen.text) for i, gen in members],
                                 attempts=retry.maximum_attempts if self.isolated else 0),
                    result_type=EnvStepBatchResult, task_queue=queue,
                    schedule_to_start_timeout=timedelta(seconds=max(t.pickup_s
                                                                    for t in timeouts)),
                    start_to_close_timeout=timedelta(seconds=max(t.step_s for t in timeouts)),
                    heartbeat_timeout=timedelta(seconds=max(t.heartbeat_s for t in timeouts)),
                    retry_policy=retry)
            except ActivityError as err:
                if not self.isolated or is_cancelled_exception(err):
                    raise
                failed = {i: TurnFailed.of("step", err) for i, _ in members}
                if env_worker_lost(err):  # no worker of its queue picked the batch up
                    return await self._restored(specs, members, resets, actions, failed)
                return failed
            failures = done.failures or [None] * len(members)
            steps = {i: step if failure is None else _step_failed(failure)
                     for (i, _), step, failure in zip(members, done.results, failures,
                                                      strict=True)}
            lost = [(i, gen) for (i, gen), failure in zip(members, failures, strict=True)
                    if failure is not None and failure.type == "EnvironmentLost"]
            if lost:  # the worker restarted: it holds none of its old envs
                steps.update(await self._restored(specs, lost, resets, actions, steps))
            return steps

        parts = await asyncio.gather(*(batch(q, members) for q, members in by_queue.items()))
        merged = {i: step for part in parts for i, step in part.items()}
        return [merged[i] for i, _ in stepping]


    async def _restored(self, specs: list[TrajectorySpec],
                        members: list[tuple[int, GenerateResult]], resets: list[EnvResetResult],
                        actions: list[list[str]], failed: dict[int, EnvStepResult | TurnFailed],
                        ) -> dict[int, EnvStepResult | TurnFailed]:
        """Steps whose env worker is gone, taken again on envs rebuilt on a live worker of the
        pool (reset with the seed, actions replayed); an env that is not deterministic, or
        was rebuilt MAX_RESTORES times already, keeps its failure in `failed`."""
        if not workflow.patched(RESTORE_LOST_ENVS):
            return {i: failed[i] for i, _ in members}
        restorable = [(i, gen) for i, gen in members
                      if resets[i].deterministic and self.restores.get(i, 0) < MAX_RESTORES]
        kept = {i for i, _ in restorable}
        out = {i: failed[i] for i, _ in members if i not in kept}

        async def rebuild(i: int) -> EnvResetResult | TurnFailed:
            self.restores[i] = self.restores.get(i, 0) + 1
            workflow.logger.warning("env worker of %s is gone; rebuilding its episode (%d "
                                    "actions)", specs[i].trajectory_id, len(actions[i]))
            try:
                return await restore_env(specs[i], actions[i])
            except ActivityError as err:
                if is_cancelled_exception(err):
                    raise
                return TurnFailed.of("step", err)

        again = []
        rebuilt = await asyncio.gather(*(rebuild(i) for i, _ in restorable))
        for (i, gen), env in zip(restorable, rebuilt, strict=True):
            if isinstance(env, TurnFailed):
                out[i] = env
                continue
            resets[i] = resets[i].model_copy(update={"worker_queue": env.worker_queue})
            again.append((i, gen))
        steps = await self._step(specs, again, resets, actions) if again else []
        out.update({i: step for (i, _), step in zip(again, steps, strict=True)})
        return out


def _step_failed(failure: EnvStepFailure) -> TurnFailed:
    return TurnFailed("step", f"step: {failure.type}", failure.message)


async def _give_back(spec: TrajectorySpec, reset: EnvResetResult) -> None:
    """A failed trajectory's env, closed if its worker still holds it (best effort: the worker
    may be gone, and the env may have closed itself when it raised)."""
    with contextlib.suppress(ActivityError):
        await close_env(spec, reset.worker_queue)
