"""BatchRolloutWorkflow's batched turns against the real dev server, with the fleet's activities
replaced under their real names (no engine, no env worker): what the workflow does when one
replica's batch fails."""

from __future__ import annotations

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
    EnvStepBatch,
    EnvStepBatchResult,
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
from rollart.workflows.batch_rollout import BatchRolloutWorkflow

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
