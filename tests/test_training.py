"""TrainingWorkflow end to end: real dev server, real vLLM engine, real trainer."""

from __future__ import annotations

import asyncio
import math
import subprocess

import envs_for_tests  # noqa: F401  (registers the test environments)
import pytest
from conftest import make_config
from temporalio.client import WorkflowFailureError

from rollart.contracts import TrainingStatus
from rollart.store import TrajectoryStore
from rollart.workers.devserver import temporal_binary
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_short_run_trains_and_accounts_for_every_trajectory(temporal_server, engine,
                                                                  tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "env.name": "exploding", "env.kwargs": {"every": 5},
        "algorithm.group_size": 4, "algorithm.batch_size": 12, "algorithm.iterations": 3,
        "algorithm.minibatches": 1,
    })
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
    assert ledger.started == 36
    assert ledger.in_flight == 0
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    assert ledger.failed > 0 and ledger.trained > 0
    assert ledger.failed == len(failed_children)
    assert any("boom: the simulator crashed" in f for f in status.failures)
    assert [m.version for m in status.history] == [1, 2, 3]
    assert all(math.isfinite(m.loss) for m in status.history)

    # sync mode: every token of iteration i was sampled by version i, as the store records
    store = TrajectoryStore(config.store_dir)
    for iteration in range(3):
        ids = [p.name for p in config.store_dir.glob(f"e2e-train.it{iteration:05d}.*")]
        assert ids
        versions = {r.version for tid in ids for r in store.read(tid)}
        assert versions == {iteration}


async def test_unknown_env_fails_the_run_up_front(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path).model_copy(deep=True)
    config.env.name = "nosuchenv"  # skips the CLI's check: the workflow itself must refuse
    async with in_process_fleet(config, engine, roles=("control", "env")) as client:
        with pytest.raises(WorkflowFailureError) as failed:
            await client.execute_workflow(
                TrainingWorkflow.run, TrainingInput(config=config), id="bad-env",
                task_queue=config.temporal.control_queue,
            )
    assert "env.name: unknown environment 'nosuchenv'" in str(failed.value.cause.cause)


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
