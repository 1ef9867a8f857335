"""TrajectoryWorkflow against the real dev server and the real vLLM engine."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import envs_for_tests  # noqa: F401  (registers the test environments)
import pytest
from conftest import make_config
from temporalio.api.enums.v1 import PendingActivityState, WorkflowExecutionStatus
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import is_cancelled_exception
from temporalio.testing import ActivityEnvironment

from rollart.activities.generate import GenerateActivities
from rollart.blobs import LocalBlobs
from rollart.config import SamplingConfig
from rollart.contracts import GenerateRequest, TrajectoryResult, TrajectorySpec
from rollart.store import TrajectoryStore
from rollart.weights import Puller
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
ROLLOUT_ROLES = ("control", "env", "reward", "gen")


def spec_for(config, tid: str, env_name: str, max_turns: int) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, "frozenlake", tid, "g", seed=7).model_copy(
        update={"env_name": env_name, "max_turns": max_turns})


async def scheduled_activities(client, workflow_id: str) -> Counter:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    field = "activity_task_scheduled_event_attributes"
    return Counter(getattr(e, field).activity_type.name for e in history.events
                   if e.HasField(field))


async def history_size(client, workflow_id: str) -> tuple[int, int]:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return len(history.events), sum(event.ByteSize() for event in history.events)


async def test_history_grows_linearly_and_stays_small(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path)
    sizes = {}
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        for turns in (10, 25, 50):
            tid = f"corridor-{turns}"
            result = await client.execute_workflow(
                TrajectoryWorkflow.run, spec_for(config, tid, "corridor", turns), id=tid,
                task_queue=config.temporal.control_queue, result_type=TrajectoryResult,
            )
            assert result.turns == turns and result.status == "completed"
            sizes[turns] = await history_size(client, tid)
    (e10, _), (e25, b25), (e50, b50) = sizes[10], sizes[25], sizes[50]
    per_turn_events = (e50 - e25) / 25
    assert per_turn_events == (e25 - e10) / 15  # exactly linear in turns
    # two activities, two workflow tasks and two router markers (route, release) per turn
    assert per_turn_events <= 14
    per_turn_bytes = (b50 - b25) / 25
    print(f"history: {per_turn_events} events and {per_turn_bytes:.0f} bytes per turn; "
          f"50 turns = {e50} events, {b50} bytes")
    assert per_turn_bytes < 3 * 1024
    assert b50 < 200 * 1024 and e50 < 800  # far below the 50 MiB / 51,200-event limits
    # the tokens live in the store, one file per turn
    assert len(TrajectoryStore(config.store_dir).read("corridor-50")) == 50


async def test_env_error_fails_only_its_trajectory(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path)
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                TrajectoryWorkflow.run,
                spec_for(config, "exploding-1", "exploding", 5).model_copy(
                    update={"env_kwargs": {"every": 1}}),
                id="exploding-1", task_queue=config.temporal.control_queue,
            )
        assert "boom: the simulator crashed" in str(failed.value.cause)
        assert "in step (turn 0)" in str(failed.value.cause)
        description = await client.get_workflow_handle("exploding-1").describe()
        assert description.status == WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_FAILED

        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                TrajectoryWorkflow.run, spec_for(config, "broken-1", "broken_reset", 5),
                id="broken-1", task_queue=config.temporal.control_queue,
            )
        assert "cannot start the sandbox" in str(failed.value.cause)


async def test_cancelled_trajectory_releases_its_environment(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path)
    closed_before = len(envs_for_tests.SlowStep.closed)
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        handle = await client.start_workflow(
            TrajectoryWorkflow.run, spec_for(config, "slow-1", "slow", 5),
            id="slow-1", task_queue=config.temporal.control_queue,
        )
        for _ in range(100):
            if (await handle.query(TrajectoryWorkflow.progress))["phase"] == "step":
                break
            await asyncio.sleep(0.1)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError) as ended:
            await handle.result()
        assert is_cancelled_exception(ended.value.cause)
    assert len(envs_for_tests.SlowStep.closed) == closed_before + 1


async def test_a_reward_worker_killed_mid_score_is_replaced_after_its_heartbeat(
        temporal_server, engine, tmp_path):
    """The reward worker is SIGKILLed while it scores; the score is retried on the next reward
    worker after the reward heartbeat timeout (10 s), not the reward timeout (60 s)."""
    config = make_config(temporal_server, tmp_path)
    worker_config = tmp_path / "reward-worker.json"
    worker_config.write_text(config.model_copy(
        update={"plugins": [envs_for_tests.__file__]}).model_dump_json())
    with (tmp_path / "reward-worker.log").open("wb") as log:
        dying = subprocess.Popen(
            [sys.executable, "-m", "rollart.workers.cli", "worker", "--config",
             str(worker_config), "--role", "reward"], stdout=log, stderr=subprocess.STDOUT,
            env={**os.environ, envs_for_tests.REWARD_HANGS_ENV: "1"})
    try:
        async with in_process_fleet(config, engine, ("control", "env", "gen")) as client:
            handle = await client.start_workflow(
                TrajectoryWorkflow.run, spec_for(config, "reward-dies-1", "reward_hangs", 10),
                id="reward-dies-1", task_queue=config.temporal.control_queue,
                result_type=TrajectoryResult)
            for _ in range(600):
                pending = (await handle.describe()).raw_description.pending_activities
                if any(a.activity_type.name == "reward.compute"
                       and a.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
                       for a in pending):
                    break
                await asyncio.sleep(0.1)
            else:
                pytest.fail("the reward worker never started scoring")
            dying.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            async with in_process_fleet(config, engine, ("reward",)):
                result = await handle.result()
            assert result.status == "completed"
            assert time.monotonic() - killed < 25
    finally:
        dying.kill()
        dying.wait()


async def test_cancelled_generate_aborts_the_engine_request(engine, tmp_path):
    """A generate activity cancelled mid-request (here: the engine is paused, so the request
    cannot finish) aborts its vLLM request instead of leaving it to run."""
    activities = GenerateActivities(engine, Puller(LocalBlobs(tmp_path)))
    request = GenerateRequest(trajectory_id="abort-1", turn=0, observation="P F F F",
                              store_dir=str(tmp_path), sampling=SamplingConfig(),
                              action_vocabulary=None)
    env = ActivityEnvironment()
    await engine.llm.pause_generation(mode="keep", clear_cache=False)
    try:
        task = asyncio.ensure_future(env.run(activities.generate, request))
        for _ in range(50):
            if engine.running_requests:
                break
            await asyncio.sleep(0.05)
        assert engine.running_requests == 1
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        await engine.llm.resume_generation()
    assert engine.running_requests == 0
    assert engine.llm.output_processor.get_num_unfinished_requests() == 0


async def test_batch_rollout_steps_every_trajectory_in_lockstep(temporal_server, engine,
                                                                tmp_path):
    config = make_config(temporal_server, tmp_path)
    specs = [spec_for(config, f"lockstep-{i}", "corridor", 4) for i in range(3)]
    specs.append(spec_for(config, "lockstep-boom", "exploding", 4).model_copy(
        update={"env_kwargs": {"every": 1}}))
    async with in_process_fleet(config, engine, ROLLOUT_ROLES) as client:
        results = await client.execute_workflow(
            BatchRolloutWorkflow.run, specs, id="lockstep", result_type=list[TrajectoryResult],
            task_queue=config.temporal.control_queue,
        )
        scheduled = await scheduled_activities(client, "lockstep")
    assert [r.turns for r in results] == [4, 4, 4, 0]
    # the env that raised failed its own trajectory; the batch went on without it
    assert [r.status for r in results] == ["completed"] * 3 + ["failed"]
    assert results[3].failure == "step: EnvironmentError"
    assert "boom: the simulator crashed" in results[3].error
    store = TrajectoryStore(config.store_dir)
    assert all(len(store.read(f"lockstep-{i}")) == 4 for i in range(3))
    # one generate and one env activity per turn for the whole batch (one replica, one env
    # worker), not one each per trajectory
    assert scheduled["gen.generate_batch"] == 4 and scheduled["env.step_batch"] == 4
    assert "gen.generate" not in scheduled and "env.step" not in scheduled
