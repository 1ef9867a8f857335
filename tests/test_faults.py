"""The long tail of environments: transient failures are retried with backoff, a hung env is
detected within its bounds, and neither ever takes an env step twice."""

from __future__ import annotations

import asyncio

import envs_for_tests
import pytest
from conftest import make_config
from temporalio.client import WorkflowFailureError

from rollart.contracts import TrajectoryResult, TrajectorySpec
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
ROLLOUT_ROLES = ("control", "env", "reward", "gen")


def faulty_config(temporal_server, tmp_path, **faults):
    return make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": "counting", "domains.frozenlake.max_turns": 4,
        "domains.frozenlake.faults": faults,
        "domains.frozenlake.timeouts": {"step_s": 1.0, "attempts": 8, "first_retry_s": 0.1},
    })


async def run(client, config, tid: str, seed: int) -> TrajectoryResult:
    spec = TrajectorySpec.for_domain(config, "frozenlake", tid, "g", seed=seed)
    return await client.execute_workflow(TrajectoryWorkflow.run, spec, id=tid,
                                         task_queue=config.temporal.control_queue,
                                         result_type=TrajectoryResult)


async def test_transient_env_failures_are_retried(temporal_server, engine, tmp_path):
    config = faulty_config(temporal_server, tmp_path, step_failure_rate=0.4)
    config.domains["frozenlake"].timeouts.attempts = 12
    seeds = range(9100, 9105)
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        results = [await run(client, config, f"flaky-{seed}", seed) for seed in seeds]
        histories = [await client.get_workflow_handle(f"flaky-{seed}").fetch_history()
                     for seed in seeds]
    assert all(r.status == "completed" and r.turns == 4 for r in results)
    assert all(envs_for_tests.CountingCorridor.steps[seed] == 4 for seed in seeds)
    # failures were injected and retried (in Temporal, not in the env): some step's last
    # attempt is not its first (all 20 steps passing first time: 0.6^20, about 4e-5)
    retried = [e for h in histories for e in h.events
               if e.HasField("activity_task_started_event_attributes")
               and e.activity_task_started_event_attributes.attempt > 1]
    assert retried


async def test_a_hung_env_is_detected_and_its_retry_does_not_step_twice(temporal_server, engine,
                                                                        tmp_path):
    config = faulty_config(temporal_server, tmp_path, step_hang_rate=0.5, hang_s=2.0)
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        result = await run(client, config, "hangs-then-goes-on", 9200)
    assert result.status == "completed" and result.turns == 4
    assert envs_for_tests.CountingCorridor.steps[9200] == 4


async def test_an_env_that_always_hangs_fails_its_trajectory_clearly(temporal_server, engine,
                                                                     tmp_path):
    config = faulty_config(temporal_server, tmp_path, step_hang_rate=1.0, hang_s=2.0)
    config.domains["frozenlake"].timeouts.attempts = 2
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        with pytest.raises(WorkflowFailureError) as failed:
            await run(client, config, "always-hangs", 9300)
    message = str(failed.value.cause)
    assert "failed in step (turn 0)" in message and "StartToClose timeout" in message
    assert envs_for_tests.CountingCorridor.steps[9300] == 0


async def test_an_oversized_observation_fails_its_trajectory_clearly(temporal_server, engine,
                                                                      tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": "chatty", "domains.frozenlake.kwargs": {"size": 5000},
        "domains.frozenlake.max_observation_chars": 1000})
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        with pytest.raises(WorkflowFailureError) as failed:
            await run(client, config, "chatty-1", 1)
    message = str(failed.value.cause)
    assert "observation of 5000 characters" in message and "max_observation_chars" in message
    assert "in step (turn 0)" in message


async def lose_env_worker(temporal_server, engine, tmp_path, env: str, tid: str, seed: int):
    """One 8-turn episode of `env` whose env worker shuts down after its third turn, another
    worker taking over the pool; (config, the episode's result), or its failure raised."""
    from rollart.workers.fleet import _all, build_workers

    config = make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": env, "domains.frozenlake.max_turns": 8,
        "domains.frozenlake.faults": {"step_mean_s": 0.3},
        "domains.frozenlake.timeouts": {"pickup_s": 2.0}})
    spec = TrajectorySpec.for_domain(config, "frozenlake", tid, "g", seed=seed)
    async with in_process_fleet(config, engine, ("control", "reward", "gen")) as client:
        handle = await client.start_workflow(TrajectoryWorkflow.run, spec, id=tid,
                                             task_queue=config.temporal.control_queue,
                                             result_type=TrajectoryResult)
        async with _all(await build_workers(config, client, "env")):
            while (await handle.query(TrajectoryWorkflow.progress))["turn"] < 3:
                await asyncio.sleep(0.1)
        async with _all(await build_workers(config, client, "env")):  # another env worker
            return config, await handle.result()


async def test_a_deterministic_episode_outlives_its_env_worker(temporal_server, engine, tmp_path):
    """The next step after the loss finds no worker; the episode is rebuilt on the other worker
    from its seed and actions, and the policy sees the observations it would have seen."""
    from rollart.store import TrajectoryStore

    config, result = await lose_env_worker(temporal_server, engine, tmp_path, "walk", "walk-1",
                                           seed=2)
    assert result.status == "completed" and result.turns == 8 and result.env_restores == 1
    records = TrajectoryStore(config.store_dir).read("walk-1")
    walk = envs_for_tests.Walk()
    expected = [walk.reset(2)[0]]
    for record in records[:-1]:
        expected.append(walk.step(engine.decode(record.sampled_ids)).observation)
    assert [engine.decode(r.observation_ids) for r in records] == expected


async def test_a_lost_episode_of_an_env_that_cannot_be_rebuilt_fails_clearly(
        temporal_server, engine, tmp_path):
    with pytest.raises(WorkflowFailureError) as failure:
        await lose_env_worker(temporal_server, engine, tmp_path, "counting", "counting-lost",
                              seed=3)
    assert "failed in step" in str(failure.value.cause)


async def test_a_lockstep_batch_rebuilds_the_episodes_of_a_lost_env_worker(
        temporal_server, engine, tmp_path):
    """As a trajectory's: the batch's next step finds no worker, and each of its deterministic
    episodes is rebuilt on the other worker and goes on."""
    from rollart.store import TrajectoryStore
    from rollart.workers.fleet import _all, build_workers
    from rollart.workflows.batch_rollout import BatchRolloutWorkflow

    config = make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": "walk", "domains.frozenlake.max_turns": 8,
        "domains.frozenlake.faults": {"step_mean_s": 0.3},
        "domains.frozenlake.timeouts": {"pickup_s": 2.0}})
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"walk-batch-{i}", "g", seed=i)
             for i in range(2)]
    store = TrajectoryStore(config.store_dir)
    async with in_process_fleet(config, engine, ("control", "reward", "gen")) as client:
        handle = await client.start_workflow(BatchRolloutWorkflow.run, specs, id="walk-batch",
                                             task_queue=config.temporal.control_queue,
                                             result_type=list[TrajectoryResult])
        async with _all(await build_workers(config, client, "env")):
            while len(store.read(specs[0].trajectory_id)) < 3:
                await asyncio.sleep(0.1)
        async with _all(await build_workers(config, client, "env")):  # another env worker
            results = await handle.result()
    assert [(r.status, r.turns, r.env_restores) for r in results] == [("completed", 8, 1)] * 2
