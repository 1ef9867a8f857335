"""TrajectoryWorkflow: one agent episode, reset -> (generate -> step)* -> reward.

Each step is an activity on the queue of the fleet that owns it, so a slow or failing environment
delays or fails only its own trajectory. Each turn's replica is chosen by the router (a local
activity, see rollart.activities.route); a request no replica picks up in time is re-routed, to a
fallback pool if the domain's own pool has no live replica. The result is a reference (the
trajectory id plus a few scalars); the tokens stay in the trajectory store. A trajectory started by
a TrainingWorkflow reports how it ended (completed, failed or cancelled) to its parent by signal,
which reaches the parent's latest run across continue-as-new; a lockstep batch's member re-run on
its own (`rollart replay`) reports to the batch's training run the same way."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

with workflow.unsafe.imports_passed_through():
    from rollart.config import InjectedFaults
    from rollart.contracts import (
        CONTEXT_FULL,
        Activity,
        EnvResetRequest,
        EnvResetResult,
        EnvRestoreRequest,
        EnvStepRequest,
        EnvStepResult,
        GenerateRequest,
        GenerateResult,
        PoolUsage,
        ReleaseRequest,
        RewardRequest,
        RewardResult,
        RouteDecision,
        RouteRequest,
        TrajectoryResult,
        TrajectorySpec,
    )
    from rollart.queues import admin_queue, replica_queue
    from rollart.search_attributes import FAILED_IN, RUN

GENERATE_HEARTBEAT = timedelta(seconds=10)
REWARD_HEARTBEAT = timedelta(seconds=10)
REWARD_MAX_BACKOFF = timedelta(seconds=30)
GENERATE_ATTEMPTS = 5
GENERATE_SENDS = 20
ONLY_REPLICA_PICKUP = timedelta(minutes=10)
MAX_PICKUP = timedelta(minutes=10)
PING_TIMEOUT = timedelta(seconds=10)
ROUTE_TIMEOUT = timedelta(seconds=10)
PING_BEFORE_MARKING_DOWN = "ping-before-marking-down"
SILENT_REPLICA_IS_DOWN = "silent-replica-is-down"
RESTORE_LOST_ENV = "restore-lost-env"
ONLY_REPLICA_UNROUTED = "only-replica-unrouted"
MAX_RESTORES = 3
DONE_SIGNAL = "trajectory_done"


def env_retry(spec: TrajectorySpec) -> RetryPolicy:
    timeouts = spec.env_timeouts
    return RetryPolicy(initial_interval=timedelta(seconds=timeouts.first_retry_s),
                       backoff_coefficient=2.0, maximum_attempts=timeouts.attempts)


async def reset_env(spec: TrajectorySpec) -> EnvResetResult:
    return await workflow.execute_activity(
        Activity.ENV_RESET,
        EnvResetRequest(trajectory_id=spec.trajectory_id, env_name=spec.env_name,
                        domain=spec.domain,
                        env_kwargs=spec.env_kwargs, seed=spec.seed, faults=spec.faults,
                        max_observation_chars=spec.max_observation_chars),
        result_type=EnvResetResult, task_queue=spec.env_queue,
        start_to_close_timeout=timedelta(seconds=spec.env_timeouts.reset_s),
        heartbeat_timeout=timedelta(seconds=spec.env_timeouts.heartbeat_s),
        retry_policy=env_retry(spec),
    )


async def generate_turn(spec: TrajectorySpec, turn: int, observation: str,
                        reset: EnvResetResult, previous: GenerateResult | None,
                        ) -> tuple[GenerateResult, RouteDecision, int]:
    """One turn on the replica the router picks; (result, route, times it was sent again).

    A request no replica picks up in time, or whose replica goes silent, is sent again through
    the router. A replica that went silent mid-request is marked down; one that left a request
    in its queue, only when it does not answer a ping either (a full queue is not a dead
    replica). Never the domain's only replica: there, waiting for it is all there is, so its
    requests wait long before anything is sent again."""
    only_replica = sum(replicas for _, replicas in spec.gen_pools) == 1
    pickup = first_pickup(spec)
    context_tokens = previous.prompt_tokens + previous.new_tokens if previous else 0
    failures = 0
    unrouted = only_replica and workflow.patched(ONLY_REPLICA_UNROUTED)
    for send in range(1, GENERATE_SENDS + 1):
        request_id = f"{spec.trajectory_id}.{turn}.{send}"
        decision = _only_replica(spec) if unrouted else await workflow.execute_local_activity(
            Activity.GEN_ROUTE,
            RouteRequest(request_id=request_id, trajectory_id=spec.trajectory_id,
                         group_id=spec.group_id, context_tokens=context_tokens,
                         pools=spec.gen_pools, routing=spec.routing),
            result_type=RouteDecision, start_to_close_timeout=ROUTE_TIMEOUT)
        request = turn_request(spec, turn, observation, reset, previous, request_id)
        try:
            result = await workflow.execute_activity(
                Activity.GEN_GENERATE, request, result_type=GenerateResult,
                task_queue=decision.queue,
                schedule_to_start_timeout=pickup,
                start_to_close_timeout=timedelta(seconds=spec.sampling.generate_timeout_s),
                heartbeat_timeout=GENERATE_HEARTBEAT, retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as err:
            outcome = _outcome(err)
            if outcome == "unreachable" and await _alive_but_busy(err, decision.queue, spec):
                outcome = "busy"
            elif outcome == "unreachable" and only_replica:
                outcome = "failed"  # nowhere else to go: marking it down would change nothing
            if not unrouted:
                await _release(spec, request_id, outcome)
            if outcome == "cancelled" or non_retryable(err):
                raise
            if outcome == "busy":
                pickup = min(pickup * 2, MAX_PICKUP)
                continue
            failures += 1
            if failures == GENERATE_ATTEMPTS or send == GENERATE_SENDS:
                raise
            await workflow.sleep(min(2 ** (failures - 1), 10))
            continue
        if not unrouted:
            await _release(spec, request_id, "ok")
        return result, decision, send - 1
    raise ApplicationError(f"turn {turn} of {spec.trajectory_id} was sent {GENERATE_SENDS} "
                           "times and never served: its replicas stay alive but full",
                           type="ReplicasSaturated")


def turn_request(spec: TrajectorySpec, turn: int, observation: str, reset: EnvResetResult,
                 previous: GenerateResult | None, request_id: str) -> GenerateRequest:
    return GenerateRequest(
        trajectory_id=spec.trajectory_id, turn=turn, observation=observation,
        request_id=request_id, after=previous.request_id if previous else None,
        store_dir=spec.store_dir, sampling=spec.sampling,
        action_vocabulary=reset.action_vocabulary, answer_alphabet=reset.answer_alphabet,
        answer_length=reset.answer_length)


def first_pickup(spec: TrajectorySpec) -> timedelta:
    """How long a turn's first send may wait for its replica to pick it up: long where there
    is no other replica to go to."""
    if sum(replicas for _, replicas in spec.gen_pools) == 1:
        return ONLY_REPLICA_PICKUP
    return timedelta(seconds=spec.routing.schedule_to_start_s)


def _only_replica(spec: TrajectorySpec) -> RouteDecision:
    """The decision the router would make with one replica in all: no local activity for it
    (two a turn with the release, each a history marker and a workflow activation)."""
    return sticky_replica(spec, 0, "only_replica")


def sticky_replica(spec: TrajectorySpec, slot: int, reason: str) -> RouteDecision:
    """The replica at `slot` (modulo their number) of the domain's first pool with replicas,
    chosen without the router."""
    pool, replicas = next((p, n) for p, n in spec.gen_pools if n)
    return RouteDecision(queue=replica_queue("gen", pool, slot % replicas), pool=pool,
                         replica=slot % replicas, fallback=pool != spec.gen_pools[0][0],
                         reason=reason)


async def _alive_but_busy(err: ActivityError, queue: str, spec: TrajectorySpec) -> bool:
    """Whether a replica that did not serve a request still lives. One that took the request
    and then stopped heartbeating died (a busy replica keeps heartbeating while it waits on its
    engine): asking it too cost a ping's timeout per lost turn (10 s of a chaos run's recovery).
    One whose queue held the request past the pickup timeout may be full, so it is pinged."""
    if _went_silent(err) and workflow.patched(SILENT_REPLICA_IS_DOWN):
        return False
    return (workflow.patched(PING_BEFORE_MARKING_DOWN)
            and await _answers_ping(queue, spec.routing.schedule_to_start_s))


def _went_silent(err: ActivityError) -> bool:
    cause = err.cause
    return isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT


async def _answers_ping(queue: str, pickup_s: float) -> bool:
    timeout = min(PING_TIMEOUT, timedelta(seconds=pickup_s))
    try:
        await workflow.execute_activity(
            Activity.GEN_PING, task_queue=admin_queue(queue), schedule_to_start_timeout=timeout,
            start_to_close_timeout=timeout, retry_policy=RetryPolicy(maximum_attempts=1))
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        return False
    return True


def _outcome(err: ActivityError) -> str:
    if is_cancelled_exception(err):
        return "cancelled"
    cause = err.cause
    if isinstance(cause, TimeoutError) and cause.type in (TimeoutType.SCHEDULE_TO_START,
                                                          TimeoutType.HEARTBEAT):
        return "unreachable"  # no worker took it, or the one that did went silent
    return "failed"


def non_retryable(err: ActivityError) -> bool:
    return isinstance(err.cause, ApplicationError) and err.cause.non_retryable


async def _release(spec: TrajectorySpec, request_id: str, outcome: str) -> None:
    try:
        await workflow.execute_local_activity(
            Activity.GEN_RELEASE, ReleaseRequest(request_id=request_id, outcome=outcome,
                                          down_s=spec.routing.down_s),
            start_to_close_timeout=ROUTE_TIMEOUT)
    except (ActivityError, asyncio.CancelledError):  # bookkeeping only: never fail a turn on it
        workflow.logger.info("router release of %s did not run", request_id)


def step_request(spec: TrajectorySpec, action: str) -> EnvStepRequest:
    return EnvStepRequest(trajectory_id=spec.trajectory_id, action=action,
                          faults=None if spec.faults == InjectedFaults() else spec.faults,
                          max_observation_chars=spec.max_observation_chars)


async def step_env(spec: TrajectorySpec, worker_queue: str, action: str) -> EnvStepResult:
    return await workflow.execute_activity(
        Activity.ENV_STEP, step_request(spec, action),
        result_type=EnvStepResult, task_queue=worker_queue,
        schedule_to_start_timeout=timedelta(seconds=spec.env_timeouts.pickup_s),
        start_to_close_timeout=timedelta(seconds=spec.env_timeouts.step_s),
        heartbeat_timeout=timedelta(seconds=spec.env_timeouts.heartbeat_s),
        retry_policy=env_retry(spec),
    )


async def restore_env(spec: TrajectorySpec, actions: list[str]) -> EnvResetResult:
    """The episode rebuilt on any live worker of the env pool (its own worker is gone)."""
    return await workflow.execute_activity(
        Activity.ENV_RESTORE,
        EnvRestoreRequest(trajectory_id=spec.trajectory_id, env_name=spec.env_name,
                          domain=spec.domain,
                          env_kwargs=spec.env_kwargs, seed=spec.seed, faults=spec.faults,
                          max_observation_chars=spec.max_observation_chars, actions=actions),
        result_type=EnvResetResult, task_queue=spec.env_queue,
        start_to_close_timeout=timedelta(seconds=spec.env_timeouts.reset_s),
        heartbeat_timeout=timedelta(seconds=spec.env_timeouts.heartbeat_s),
        retry_policy=env_retry(spec),
    )


def env_worker_lost(err: ActivityError) -> bool:
    """No worker of the env's own queue picked the step up, or the worker that did holds no
    such env (it restarted)."""
    cause = err.cause
    if isinstance(cause, TimeoutError):
        return cause.type == TimeoutType.SCHEDULE_TO_START
    return isinstance(cause, ApplicationError) and cause.type == "EnvironmentLost"


async def close_env(spec: TrajectorySpec, worker_queue: str) -> None:
    await workflow.execute_activity(
        Activity.ENV_CLOSE, spec.trajectory_id, task_queue=worker_queue,
        schedule_to_start_timeout=timedelta(seconds=spec.env_timeouts.pickup_s),
        start_to_close_timeout=timedelta(seconds=spec.env_timeouts.step_s),
        retry_policy=env_retry(spec),
    )


async def score(spec: TrajectorySpec, rewards: list[float], info: dict[str, object],
                prompt: str, actions: list[str]) -> RewardResult:
    """Scores with the domain's reward; the result says how long it took from the moment the
    trajectory ended (`latency_s`: queueing, retries and the scoring itself)."""
    cfg, ended = spec.reward, workflow.now()
    result = await workflow.execute_activity(
        Activity.REWARD_COMPUTE,
        RewardRequest(trajectory_id=spec.trajectory_id, env_name=spec.env_name,
                      env_rewards=rewards, final_info=info, domain=spec.domain,
                      reward=cfg, prompt=prompt, actions=actions),
        result_type=RewardResult, task_queue=spec.reward_queue,
        start_to_close_timeout=timedelta(seconds=cfg.activity_timeout_s()),
        heartbeat_timeout=REWARD_HEARTBEAT,
        retry_policy=RetryPolicy(initial_interval=timedelta(seconds=cfg.backoff_s),
                                 backoff_coefficient=2.0, maximum_interval=REWARD_MAX_BACKOFF,
                                 maximum_attempts=cfg.attempts),
    )
    result.latency_s = (workflow.now() - ended).total_seconds()
    return result


def failure_reason(phase: str, err: ActivityError) -> str:
    """'<phase>: <the error's type>', few enough distinct values to count by."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type:
        reason = cause.type
    elif isinstance(cause, TimeoutError):
        reason = f"{cause.type.name.lower()} timeout" if cause.type is not None else "timeout"
    else:
        reason = type(cause).__name__ if cause is not None else type(err).__name__
    return f"{phase}: {reason}"


@workflow.defn
class TrajectoryWorkflow:
    def __init__(self) -> None:
        self.turn = 0
        self.phase = "reset"
        self.env_queue: str | None = None
        self.open_env = False
        self.partial: TrajectoryResult | None = None
        self.actions: list[str] = []  # the episode's actions so far, to rebuild its env
        self.restores = 0
        self.report_to = ""  # the training workflow, where it is not the parent

    @workflow.query
    def progress(self) -> dict[str, object]:
        return {"turn": self.turn, "phase": self.phase}

    @workflow.run
    async def run(self, spec: TrajectorySpec) -> TrajectoryResult:
        self.report_to = spec.report_to
        self.partial = TrajectoryResult(trajectory_id=spec.trajectory_id,
                                        group_id=spec.group_id, domain=spec.domain,
                                        status="cancelled", start_version=spec.start_version)
        try:
            result = await self._episode(spec)
        except (asyncio.CancelledError, ActivityError) as err:
            if not is_cancelled_exception(err):
                return await self._fail(spec, err)
            # Evicted or redundant: give the environment back, tell the parent what the
            # trajectory looked like so far, and end as cancelled.
            await self._release_env(spec)
            await self._report(self.partial)
            raise
        await self._report(result)
        return result

    async def _fail(self, spec: TrajectorySpec, err: ActivityError) -> TrajectoryResult:
        cause = err.cause.message if err.cause is not None else str(err)
        message = (f"trajectory {spec.trajectory_id} failed in {self.phase} "
                   f"(turn {self.turn}): {cause}")
        if workflow.info().typed_search_attributes.get(RUN) is not None:  # so they exist
            workflow.upsert_search_attributes([FAILED_IN.value_set(self.phase)])
        await self._release_env(spec)
        await self._report(self.partial.model_copy(update={
            "status": "failed", "error": message, "failure": failure_reason(self.phase, err)}))
        raise ApplicationError(message, type="TrajectoryFailed", non_retryable=True) from err

    async def _episode(self, spec: TrajectorySpec) -> TrajectoryResult:
        partial = self.partial
        reset = await reset_env(spec)
        self.env_queue, self.open_env = reset.worker_queue, True
        observation, rewards, info, versions = reset.observation, [], {}, set()
        gen = None
        for self.turn in range(spec.max_turns):
            self.phase = "generate"
            gen, route, resent = await generate_turn(spec, self.turn, observation, reset, gen)
            if gen.finish_reason == CONTEXT_FULL:
                break
            versions.add(gen.version)
            partial.turns += 1
            partial.rerouted_turns += resent > 0
            partial.generated_tokens += gen.new_tokens
            partial.prompt_tokens += gen.prompt_tokens
            partial.cached_tokens += gen.cached_tokens
            partial.fallback_turns += route.fallback
            partial.gen_usage.setdefault(route.pool, PoolUsage()).add(gen)
            partial.end_version = max(partial.end_version, gen.version)
            partial.mixed_versions = partial.mixed_versions or gen.mixed_versions
            self.phase = "step"
            stepping = workflow.now()
            step = await self._step(spec, reset, gen.text)
            partial.env_step_s += (workflow.now() - stepping).total_seconds()
            partial.env_step_times.append(step.seconds)
            observation, info = step.observation, step.info
            rewards.append(step.reward)
            partial.reward = float(sum(rewards))
            if step.terminated or step.truncated:
                self.open_env = False  # the env worker frees ended episodes itself
                break
        await self._release_env(spec)
        self.phase = "reward"
        reward = await score(spec, rewards, info, reset.observation, self.actions)
        self.phase = "done"
        return partial.model_copy(update={
            "status": "completed", "mixed_versions": partial.mixed_versions or len(versions) > 1,
            **reward.for_trajectory(),
        })

    async def _step(self, spec: TrajectorySpec, reset: EnvResetResult,
                    action: str) -> EnvStepResult:
        """One env step; if the env's worker is gone and the env is deterministic, rebuild the
        episode on another worker (reset with its seed, replay its actions) and step there."""
        while True:
            try:
                step = await step_env(spec, self.env_queue, action)
                self.actions.append(action)
                return step
            except ActivityError as err:
                if not (reset.deterministic and self.restores < MAX_RESTORES
                        and env_worker_lost(err) and workflow.patched(RESTORE_LOST_ENV)):
                    raise
                workflow.logger.warning("env worker of %s is gone; rebuilding its episode "
                                        "(%d actions)", spec.trajectory_id, len(self.actions))
            self.restores += 1
            self.partial.env_restores = self.restores
            self.env_queue = (await restore_env(spec, self.actions)).worker_queue

    async def _release_env(self, spec: TrajectorySpec) -> None:
        """Best effort: the env worker may be gone (its episodes with it), and a trajectory must
        still end and report."""
        if not self.open_env:
            return
        self.open_env = False
        try:
            await close_env(spec, self.env_queue)
        except ActivityError as err:
            workflow.logger.warning("could not close the env of %s: %s", spec.trajectory_id,
                                    err.cause.message if err.cause else err)

    async def _report(self, result: TrajectoryResult) -> None:
        parent = workflow.info().parent
        training_id = parent.workflow_id if parent is not None else self.report_to
        if not training_id:
            return
        try:
            await workflow.get_external_workflow_handle(training_id).signal(DONE_SIGNAL, result)
        except Exception:  # the parent run ended: its ledger no longer waits for this one
            workflow.logger.warning("could not report %s to %s", result.trajectory_id,
                                    training_id)
