"""BatchRolloutWorkflow's batched turns against the real dev server, with the fleet's activities
replaced under their real names (no engine, no env worker): what the workflow does when one
replica's batch fails."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter

import pytest
from conftest import make_config
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollart.activities.route import RouterActivities
from rollart.contracts import (
    Activity,
    EnvResetRequest,
    EnvResetResult,
    EnvRestoreRequest,
    EnvStepBatch,
    EnvStepBatchResult,
    EnvStepFailure,
    EnvStepResult,
    GenerateBatch,
    GenerateBatchResult,
    GenerateRequest,
    GenerateResult,
    RewardRequest,
    RewardResult,
    TrajectoryResult,
    TrajectorySpec,
)
from rollart.queues import replica_queue
from rollart.workers.client import connect
from rollart.workflows.batch_rollout import DROP_SIGNAL, BatchRolloutWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
TURNS = 3


def answer(request: GenerateRequest, queue: str) -> GenerateResult:
    return GenerateResult(text="Right", prompt_tokens=4, new_tokens=1, cached_tokens=0,
                          finish_reason="length", version=0, replica=queue,
                          request_id=request.request_id)


def replica_activities(queue: str, batch_fails: bool) -> list:
    @activity.defn(name=Activity.GEN_GENERATE)
    async def generate(request: GenerateRequest) -> GenerateResult:
        return answer(request, queue)

    @activity.defn(name=Activity.GEN_GENERATE_BATCH)
    async def generate_batch(batch: GenerateBatch) -> GenerateBatchResult:
        if batch_fails:
            raise ApplicationError("this replica's batch path is broken", type="Broken")
        return GenerateBatchResult(results=[answer(r, queue) for r in batch.requests])

    return [generate, generate_batch]


def env_activities(queue: str) -> list:
    @activity.defn(name=Activity.ENV_RESET)
    async def reset(request: EnvResetRequest) -> EnvResetResult:
        return EnvResetResult(observation="start", worker_queue=queue)

    @activity.defn(name=Activity.ENV_STEP_BATCH)
    async def step_batch(batch: EnvStepBatch) -> EnvStepBatchResult:
        return EnvStepBatchResult(results=[
            EnvStepResult(observation="next", reward=1.0, terminated=False, truncated=False)
            for _ in batch.steps])

    @activity.defn(name=Activity.ENV_CLOSE)
    async def close(trajectory_id: str) -> None:
        return None

    @activity.defn(name=Activity.REWARD_COMPUTE)
    async def compute(request: RewardRequest) -> RewardResult:
        return RewardResult(reward=sum(request.env_rewards), success=True)

    return [reset, step_batch, close, compute]


async def test_a_replica_whose_batch_fails_serves_its_trajectories_one_by_one(
        temporal_server, tmp_path):
    config = make_config(temporal_server, tmp_path)
    run = uuid.uuid4().hex[:8]
    pool, env_queue = f"fake{run}", f"batch-{run}.env"
    control_queue = f"batch-{run}.control"
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"{run}-{i}", "g", seed=i)
             .model_copy(update={"max_turns": TURNS, "gen_pools": [(pool, 2)],
                                 "env_queue": env_queue, "reward_queue": env_queue})
             for i in range(4)]
    client = await connect(config.temporal)
    router = RouterActivities()
    workers = [
        Worker(client, task_queue=control_queue, workflows=[BatchRolloutWorkflow],
               activities=[router.route, router.release],
               workflow_runner=UnsandboxedWorkflowRunner()),
        Worker(client, task_queue=env_queue, activities=env_activities(env_queue)),
        Worker(client, task_queue=replica_queue("gen", pool, 0),
               activities=replica_activities("r0", batch_fails=True)),
        Worker(client, task_queue=replica_queue("gen", pool, 1),
               activities=replica_activities("r1", batch_fails=False)),
    ]
    async with workers[0], workers[1], workers[2], workers[3]:
        results = await client.execute_workflow(
            BatchRolloutWorkflow.run, specs, id=f"batch-{run}", task_queue=control_queue,
            result_type=list[TrajectoryResult])
        history = await client.get_workflow_handle(f"batch-{run}").fetch_history()
    field = "activity_task_scheduled_event_attributes"
    scheduled = Counter((getattr(e, field).activity_type.name, getattr(e, field).task_queue.name)
                        for e in history.events if e.HasField(field))
    assert [r.status for r in results] == ["completed"] * 4
    assert [r.turns for r in results] == [TURNS] * 4
    r0, r1 = replica_queue("gen", pool, 0), replica_queue("gen", pool, 1)
    # r0's batch failed once; its two trajectories then went through the router every turn
    assert scheduled[("gen.generate_batch", r0)] == 1
    assert scheduled[("gen.generate_batch", r1)] == TURNS
    assert sum(n for (name, _), n in scheduled.items() if name == "gen.generate") == 2 * TURNS
    assert scheduled[("env.step_batch", env_queue)] == TURNS


def one_replica_fleet(client, control_queue: str, env_queue: str, env: list, replica: str,
                      generation: list) -> list[Worker]:
    """The batch workflow's control worker, one env worker and one replica's worker."""
    router = RouterActivities()
    return [
        Worker(client, task_queue=control_queue, workflows=[BatchRolloutWorkflow],
               activities=[router.route, router.release],
               workflow_runner=UnsandboxedWorkflowRunner()),
        Worker(client, task_queue=env_queue, activities=env),
        Worker(client, task_queue=replica, activities=generation),
    ]


def counted_ends(calls: Counter) -> list:
    """Env close and reward, counted by trajectory ("close -2") and in all ("reward")."""
    @activity.defn(name=Activity.ENV_CLOSE)
    async def close(trajectory_id: str) -> None:
        calls[f"close {trajectory_id[-2:]}"] += 1

    @activity.defn(name=Activity.REWARD_COMPUTE)
    async def compute(request: RewardRequest) -> RewardResult:
        calls["reward"] += 1
        return RewardResult(reward=sum(request.env_rewards), success=True)

    return [close, compute]


def stepped_but(failing: list[bool], failure: EnvStepFailure) -> EnvStepBatchResult:
    """A batch's steps, each answered with `failure` where `failing` says so."""
    return EnvStepBatchResult(
        results=[None if fails else EnvStepResult(observation="next", reward=1.0,
                                                  terminated=False, truncated=False)
                 for fails in failing],
        failures=[failure if fails else None for fails in failing])


def failing_activities(queue: str, calls: Counter) -> list:
    """An env worker whose env "-2" raises on its second step and whose env "-4" cannot be
    opened, and a replica that cannot serve trajectory "-3" from its third turn on (batched or
    not)."""
    @activity.defn(name=Activity.ENV_RESET)
    async def reset(request: EnvResetRequest) -> EnvResetResult:
        if request.trajectory_id.endswith("-4"):
            raise ApplicationError("no such map", type="EnvironmentError", non_retryable=True)
        return EnvResetResult(observation="start", worker_queue=queue)

    @activity.defn(name=Activity.ENV_STEP_BATCH)
    async def step_batch(batch: EnvStepBatch) -> EnvStepBatchResult:
        calls["step_batch"] += 1
        assert batch.attempts == 3  # the env retry policy's: the last attempt isolates
        broken = [s.trajectory_id.endswith("-2") and calls["step_batch"] == 2
                  for s in batch.steps]
        return stepped_but(broken, EnvStepFailure(type="EnvironmentError",
                                                  message="RuntimeError: boom"))


    def garbage(request: GenerateRequest) -> bool:
        return request.trajectory_id.endswith("-3") and request.turn >= 2

    @activity.defn(name=Activity.GEN_GENERATE)
    async def generate(request: GenerateRequest) -> GenerateResult:
        if garbage(request):
            raise ApplicationError("the model's output is not an action", type="Garbage",
                                   non_retryable=True)
        return answer(request, "r0")

    @activity.defn(name=Activity.GEN_GENERATE_BATCH)
    async def generate_batch(batch: GenerateBatch) -> GenerateBatchResult:
        if any(garbage(r) for r in batch.requests):
            raise ApplicationError("a request cannot be served", type="Garbage",
                                   non_retryable=True)
        return GenerateBatchResult(results=[answer(r, "r0") for r in batch.requests])

    return [reset, step_batch, *counted_ends(calls), generate, generate_batch]


async def test_a_trajectory_that_fails_in_a_batch_fails_alone(temporal_server, tmp_path):
    config = make_config(temporal_server, tmp_path)
    run = uuid.uuid4().hex[:8]
    pool, env_queue, control_queue = f"fail{run}", f"fail-{run}.env", f"fail-{run}.control"
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"{run}-{i}", "g", seed=i)
             .model_copy(update={"max_turns": 4, "gen_pools": [(pool, 1)],
                                 "env_queue": env_queue, "reward_queue": env_queue})
             for i in range(5)]
    client = await connect(config.temporal)
    calls = Counter()
    fleet = failing_activities(env_queue, calls)
    workers = one_replica_fleet(client, control_queue, env_queue, fleet[:4],
                                replica_queue("gen", pool, 0), fleet[4:])
    async with workers[0], workers[1], workers[2]:
        results = await client.execute_workflow(
            BatchRolloutWorkflow.run, specs, id=f"fail-{run}", task_queue=control_queue,
            result_type=list[TrajectoryResult])
    assert [r.status for r in results] == ["completed", "completed"] + ["failed"] * 3
    assert [r.turns for r in results] == [4, 4, 1, 2, 0]
    assert results[2].failure == "step: EnvironmentError"
    assert "failed in step (turn 1): RuntimeError: boom" in results[2].error
    assert results[3].failure == "generate: Garbage"
    assert "failed in generate (turn 2)" in results[3].error
    assert results[4].failure == "reset: EnvironmentError"
    assert "failed in reset (turn 0): no such map" in results[4].error
    assert calls["reward"] == 2  # only the completed ones are scored
    assert all(calls[f"close -{i}"] == 1 for i in range(4))  # every env given back once
    assert calls["close -4"] == 0  # and the one never opened, not at all


def losing_activities(queue: str, calls: Counter) -> list:
    """An env pool whose worker restarts before the second turn of env "-1" (it no longer holds
    it), while envs "-2" and "-3" were held by a worker that is gone for good (nothing polls its
    queue); "-3" is not deterministic, so it cannot be rebuilt."""
    gone = f"{queue}.gone"

    @activity.defn(name=Activity.ENV_RESET)
    async def reset(request: EnvResetRequest) -> EnvResetResult:
        index = int(request.trajectory_id[-1])
        return EnvResetResult(observation="start", worker_queue=gone if index >= 2 else queue,
                              deterministic=index != 3)

    @activity.defn(name=Activity.ENV_RESTORE)
    async def restore(request: EnvRestoreRequest) -> EnvResetResult:
        calls[f"restore {request.trajectory_id[-2:]}"] += 1
        calls[f"replayed {request.trajectory_id[-2:]}"] += len(request.actions)
        return EnvResetResult(observation="start", worker_queue=queue, deterministic=True)

    @activity.defn(name=Activity.ENV_STEP_BATCH)
    async def step_batch(batch: EnvStepBatch) -> EnvStepBatchResult:
        for step in batch.steps:
            calls[f"steps {step.trajectory_id[-2:]}"] += 1
        lost = [s.trajectory_id.endswith("-1") and calls["steps -1"] == 2 for s in batch.steps]
        return stepped_but(lost, EnvStepFailure(type="EnvironmentLost",
                                                message="no live environment"))

    return [reset, restore, step_batch, *counted_ends(calls)]


async def test_a_batch_rebuilds_the_envs_of_a_lost_worker(temporal_server, tmp_path):
    config = make_config(temporal_server, tmp_path)
    run = uuid.uuid4().hex[:8]
    pool, env_queue, control_queue = f"lost{run}", f"lost-{run}.env", f"lost-{run}.control"
    specs = []
    for i in range(4):
        spec = TrajectorySpec.for_domain(config, "frozenlake", f"{run}-{i}", "g", seed=i)
        specs.append(spec.model_copy(update={
            "max_turns": TURNS, "gen_pools": [(pool, 1)], "env_queue": env_queue,
            "reward_queue": env_queue,
            "env_timeouts": spec.env_timeouts.model_copy(update={"pickup_s": 1.0})}))
    client = await connect(config.temporal)
    calls = Counter()
    workers = one_replica_fleet(client, control_queue, env_queue,
                                losing_activities(env_queue, calls), replica_queue("gen", pool, 0),
                                replica_activities("r0", batch_fails=False))
    async with workers[0], workers[1], workers[2]:
        results = await client.execute_workflow(
            BatchRolloutWorkflow.run, specs, id=f"lost-{run}", task_queue=control_queue,
            result_type=list[TrajectoryResult])
    assert [r.status for r in results] == ["completed"] * 3 + ["failed"]
    assert [r.turns for r in results] == [TURNS] * 3 + [0]
    assert [r.env_restores for r in results] == [0, 1, 1, 0]
    assert calls["restore -1"] == calls["restore -2"] == 1 and calls["restore -3"] == 0
    assert calls["replayed -1"] == 1 and calls["replayed -2"] == 0  # the actions before the loss
    assert results[3].failure == "step: schedule_to_start timeout"
    assert all(calls[f"close -{i}"] == 1 for i in range(3))


async def test_a_trajectory_dropped_from_a_batch_stops_and_ends_cancelled(temporal_server,
                                                                         tmp_path):
    """The training run drops an evicted or redundant trajectory by signal: it stops at its
    next turn, its env is given back, it is not scored, and the rest go on."""
    config = make_config(temporal_server, tmp_path)
    run = uuid.uuid4().hex[:8]
    pool, env_queue, control_queue = f"drop{run}", f"drop-{run}.env", f"drop-{run}.control"
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"{run}-{i}", "g", seed=i)
             .model_copy(update={"max_turns": TURNS, "gen_pools": [(pool, 1)],
                                 "env_queue": env_queue, "reward_queue": env_queue})
             for i in range(3)]
    calls, first_step, dropped = Counter(), asyncio.Event(), asyncio.Event()

    @activity.defn(name=Activity.ENV_RESET)
    async def reset(request: EnvResetRequest) -> EnvResetResult:
        return EnvResetResult(observation="start", worker_queue=env_queue)

    @activity.defn(name=Activity.ENV_STEP_BATCH)
    async def step_batch(batch: EnvStepBatch) -> EnvStepBatchResult:
        calls["step_batch"] += 1
        first_step.set()
        await dropped.wait()
        return stepped_but([False] * len(batch.steps), EnvStepFailure(type="", message=""))

    client = await connect(config.temporal)
    workers = one_replica_fleet(client, control_queue, env_queue,
                                [reset, step_batch, *counted_ends(calls)],
                                replica_queue("gen", pool, 0),
                                replica_activities("r0", batch_fails=False))
    async with workers[0], workers[1], workers[2]:
        handle = await client.start_workflow(
            BatchRolloutWorkflow.run, specs, id=f"drop-{run}", task_queue=control_queue,
            result_type=list[TrajectoryResult])
        await first_step.wait()
        await handle.signal(DROP_SIGNAL, [specs[1].trajectory_id])
        await asyncio.sleep(0.5)  # the signal is in before the step completes
        dropped.set()
        results = await handle.result()
    assert [r.status for r in results] == ["completed", "cancelled", "completed"]
    assert [r.turns for r in results] == [TURNS, 1, TURNS]
    assert calls["reward"] == 2 and all(calls[f"close -{i}"] == 1 for i in range(3))
