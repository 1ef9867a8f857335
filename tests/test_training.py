"""TrainingWorkflow end to end: real dev server, real vLLM engine, real trainer."""

from __future__ import annotations

import asyncio
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import envs_for_tests  # noqa: F401  (registers the test environments)
import pytest
from conftest import make_config
from temporalio.client import WorkflowFailureError

from rollart.config import RewardConfig
from rollart.contracts import TrainingStatus, TrajectoryResult
from rollart.store import TrajectoryStore
from rollart.workers.devserver import temporal_binary
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_async_run_trains_and_accounts_for_every_trajectory(temporal_server, engine,
                                                                  tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": "exploding", "domains.frozenlake.kwargs": {"every": 5},
        "algorithm.group_size": 4, "algorithm.batch_size": 12, "algorithm.iterations": 3,
        "algorithm.minibatches": 1, "algorithm.redundancy": 1,
    })
    assert config.algorithm.mode == "async" and config.algorithm.alpha == 1
    async with in_process_fleet(config, engine) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="e2e-train",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus,
        )
        failed_children = [w async for w in client.list_workflows(
            "WorkflowType='TrajectoryWorkflow' AND ExecutionStatus='Failed' "
            "AND WorkflowId STARTS_WITH 'e2e-train'")]
        runs = [w async for w in client.list_workflows("WorkflowId='e2e-train'")]

    ledger = status.ledger
    assert len(runs) > 1  # the server suggested continue-as-new; state carried over
    assert status.done and status.iteration == 3
    assert ledger.in_flight == 0
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    assert ledger.trained == status.redundant_kept.count
    assert ledger.failed > 0 and ledger.trained > 0 and ledger.evicted > 0
    # a child that failed after it was evicted (stale, redundant, run over) counts as evicted
    assert ledger.failed <= len(failed_children) <= ledger.failed + ledger.evicted
    assert any("boom: the simulator crashed" in f for f in status.failures)
    assert [m.version for m in status.history] == [1, 2, 3]
    failures = Counter()
    for metrics in status.history:
        failures.update(metrics.failures)
    assert 0 < sum(failures.values()) <= ledger.failed
    assert set(failures) == {"step: EnvironmentError"}
    for metrics in status.history:
        reward = metrics.rewards["rule"]
        assert reward.trajectories == metrics.trajectories
        assert 0 <= reward.latency_s_p50 <= reward.latency_s_p99
        assert 0 < reward.busy_share < 1 and reward.queue_depth_mean >= 0
        lake = metrics.domains["frozenlake"]
        assert 0 < lake.env_step_s_p50 <= lake.env_step_s_p99
        assert math.isfinite(metrics.loss)
        assert metrics.lag_max <= 1 and sum(metrics.lag_histogram.values()) == metrics.trajectories
        assert 0.0 <= metrics.stale_token_share <= 1.0
        assert metrics.ratio_max > 0


async def test_batches_give_up_the_trajectories_the_run_drops(temporal_server, engine, tmp_path):
    """Redundant siblings of a full group, and what is still rolling out when the run ends, stop
    inside their batch and end cancelled; every trajectory is still accounted for."""
    config = make_config(temporal_server, tmp_path, **{
        "algorithm.rollout_unit": "batch", "algorithm.group_size": 4,
        "algorithm.batch_size": 8, "algorithm.iterations": 3, "algorithm.minibatches": 1,
        "algorithm.redundancy": 2})
    async with in_process_fleet(config, engine) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="e2e-batch-drop",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        members = []
        async for batch in client.list_workflows(
                "WorkflowType = 'BatchRolloutWorkflow' AND ExecutionStatus = 'Completed' AND "
                "RollartRun = 'e2e-batch-drop'"):
            members += await client.get_workflow_handle(
                batch.id, result_type=list[TrajectoryResult]).result()
    ledger = status.ledger
    assert status.done and ledger.in_flight == 0
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    dropped = [r for r in members if r.status == "cancelled"]
    assert dropped and all(r.reward == 0 for r in dropped)  # stopped, never scored
    assert ledger.trained == status.redundant_kept.count


@pytest.mark.parametrize("trainer", [{}, {"trainer.ranks": 2}, {"trainer.backend": "megatron"}],
                         ids=["torch", "two-fsdp-ranks", "megatron"])
async def test_sync_never_trains_on_an_older_version(temporal_server, engine, tmp_path, trainer):
    """With two FSDP2 ranks and with megatron-core too: the engine then serves what those
    trainers gathered or converted and published, so the sampling policy is still the
    trainer's."""
    config = make_config(temporal_server, tmp_path, **{
        "algorithm.mode": "sync", "algorithm.group_size": 4, "algorithm.batch_size": 8,
        "algorithm.iterations": 2, "algorithm.minibatches": 1, **trainer,
    })
    async with in_process_fleet(config, engine) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config),
            id=f"sync-train-{len(trainer)}-{config.trainer.ranks}-{config.trainer.backend}",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus,
        )
    assert status.alpha == 0
    assert status.ledger.trained == 16 and status.ledger.evicted == 0
    for metrics in status.history:
        assert metrics.lag_histogram == {0: 8} and metrics.stale_token_share == 0.0
        # with no update in between, the trainer's old policy is the sampling policy
        assert metrics.ratio_max == pytest.approx(1.0, abs=1e-3)
    store = TrajectoryStore(config.store_dir)
    versions = {tuple(sorted({v for r in store.read(p.name) for v in r.versions}))
                for p in Path(config.store_dir).iterdir()}
    assert versions == {(0,), (1,)}


@pytest.mark.parametrize(("field", "value", "roles", "words"), [
    ("env", "nosuchenv", ("control", "env"),
     "domains.frozenlake.env: unknown environment 'nosuchenv'"),
    ("reward", RewardConfig(kind="judge"), ("control", "env", "reward"),  # a plugin not loaded
     "domains.frozenlake.reward.kind: unknown reward kind 'judge'")])
async def test_an_unknown_env_or_reward_fails_the_run_up_front(temporal_server, engine,
                                                               tmp_path, field, value, roles,
                                                               words):
    config = make_config(temporal_server, tmp_path).model_copy(deep=True)
    setattr(config.domains["frozenlake"], field, value)  # skips the CLI's check: the workflow
    async with in_process_fleet(config, engine, roles=roles) as client:
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                TrainingWorkflow.run, TrainingInput(config=config), id=f"bad-{field}",
                task_queue=config.temporal.control_queue,
            )
    assert words in str(failed.value.cause.cause)


async def test_temporal_cli_starts_a_run(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "algorithm.group_size": 2, "algorithm.batch_size": 4, "algorithm.iterations": 1,
        "algorithm.minibatches": 1,
    })
    payload = TrainingInput(config=config).model_dump_json()
    async with in_process_fleet(config, engine) as client:
        started = await asyncio.to_thread(subprocess.run, [
            temporal_binary(), "workflow", "start", "--address", temporal_server.address,
            "--type", "TrainingWorkflow", "--task-queue", config.temporal.control_queue,
            "--workflow-id", "cli-started", "--input", payload,
        ], capture_output=True, text=True, timeout=60)
        assert started.returncode == 0, started.stderr
        handle = client.get_workflow_handle("cli-started", result_type=TrainingStatus)
        status = await handle.result()
    assert status.done and status.version == 1 and status.ledger.trained == 4


async def test_a_child_terminated_by_hand_is_counted_and_the_run_goes_on(temporal_server,
                                                                         engine, tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "domains.frozenlake.env": "slow", "domains.frozenlake.kwargs": {"delay_s": 0.5},
        "domains.frozenlake.max_turns": 3, "algorithm.mode": "sync",
        "algorithm.group_size": 2, "algorithm.batch_size": 4, "algorithm.iterations": 2,
        "algorithm.minibatches": 1,
    })
    async with in_process_fleet(config, engine) as client:
        handle = await client.start_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="terminated-child",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        victim = None
        for _ in range(200):
            running = [w.id async for w in client.list_workflows(
                "WorkflowType='TrajectoryWorkflow' AND ExecutionStatus='Running' "
                "AND WorkflowId STARTS_WITH 'terminated-child'")]
            if running:
                victim = running[0]
                break
            await asyncio.sleep(0.1)
        assert victim is not None
        await client.get_workflow_handle(victim).terminate(reason="operator")
        status = await asyncio.wait_for(handle.result(), timeout=300)
    assert status.iteration == 2
    assert status.ledger.failed >= 1 and status.ledger.in_flight == 0
    assert any("ended without reporting" in f for f in status.failures)


async def test_the_cli_shows_a_run_and_stops_it_after_the_iteration_under_way(
        temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "algorithm.group_size": 4, "algorithm.batch_size": 8, "algorithm.iterations": 50,
        "algorithm.minibatches": 1})
    cli = [sys.executable, "-m", "rollart.workers.cli"]
    server = ["--set", f"temporal.address={temporal_server.address}"]
    async with in_process_fleet(config, engine) as client:
        handle = await client.start_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="stopped-by-cli",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        while (await handle.query(TrainingWorkflow.status)).iteration < 1:
            await asyncio.sleep(0.2)
        shown = await asyncio.to_thread(subprocess.run, [*cli, "status", "stopped-by-cli",
                                                         *server],
                                        capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert "rollart async (alpha 1)" in shown.stdout and "/50" in shown.stdout
        stopped = await asyncio.to_thread(subprocess.run, [*cli, "stop", "stopped-by-cli",
                                                           "--wait", *server],
                                          capture_output=True, text=True, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        status = await handle.result()
    assert "stopping after the iteration under way" in stopped.stdout
    assert status.done and 1 <= status.iteration < 50
    assert status.ledger.in_flight == 0 and status.ledger.trained == 8 * status.iteration
    assert len(status.history) == status.iteration
