"""A failed trajectory is found by its search attributes, re-run with `rollart replay`, and its
result re-enters the training run while its group still waits; a re-run of one already taken is
counted late and never trained twice. A lockstep batch's failed trajectory is found by its batch's
tags and re-run on its own, reporting to the same run."""

from __future__ import annotations

import asyncio
import subprocess

import pytest
from conftest import make_config
from envs_for_tests import Replayable

from rollart.contracts import TrainingStatus, TrajectoryResult
from rollart.workers import cli
from rollart.workers.audit import trained_ids_by_iteration
from rollart.workers.devserver import temporal_binary
from rollart.workers.fleet import in_process_fleet
from rollart.workers.replay import ReplayError, outcome, replay
from rollart.workflows.training import TrainingInput, TrainingWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
RUN_ID = "replay-failed-run"


async def until(condition, timeout_s: float = 60, every_s: float = 0.2):
    for _ in range(int(timeout_s / every_s)):
        value = await condition()
        if value:
            return value
        await asyncio.sleep(every_s)
    raise TimeoutError("condition never held")


def replayable_config(temporal_server, tmp_path, **overrides):
    """One group of 3 a batch on FrozenLake whose first env crashes on its first step."""
    return make_config(temporal_server, tmp_path, **{
        "algorithm.group_size": 3, "algorithm.batch_size": 3, "algorithm.minibatches": 1,
        "domains.frozenlake.env": "replayable", "domains.frozenlake.max_turns": 4, **overrides})


async def start_run(client, config, run_id: str):
    return await client.start_workflow(
        TrainingWorkflow.run, TrainingInput(config=config), id=run_id,
        task_queue=config.temporal.control_queue, result_type=TrainingStatus)


async def replay_from_cli(temporal_server, workflow_id: str, capsys) -> str:
    """`rollart replay ID --wait` as a person runs it; what it printed."""
    args = ["replay", workflow_id, "--wait", "--timeout", "120",
            "--set", f"temporal.address={temporal_server.address}"]
    assert await asyncio.to_thread(cli.main, args) == 0
    return capsys.readouterr().out


async def test_a_failed_trajectory_is_found_replayed_and_trained_once(temporal_server, engine,
                                                                     tmp_path, capsys):
    config = replayable_config(temporal_server, tmp_path, **{
        "algorithm.iterations": 2, "domains.frozenlake.timeouts.step_s": 300})
    Replayable.fail_next, Replayable.hold = 1, True
    Replayable.gate.clear()
    async with in_process_fleet(config, engine) as client:
        run = await start_run(client, config, RUN_ID)
        try:
            query = (f"WorkflowType = 'TrajectoryWorkflow' AND ExecutionStatus = 'Failed' AND "
                     f"RollartRun = '{RUN_ID}' AND RollartDomain = 'frozenlake' AND "
                     "RollartFailedIn = 'step'")

            async def failed():
                return [w.id async for w in client.list_workflows(query)]

            [failed_id] = await until(failed)
            Replayable.hold = False  # the re-run's env is not held back
            status = await run.query(TrainingWorkflow.status)
            assert status.ledger.failed == 1 and status.readmitted == 0

            printed = await replay_from_cli(temporal_server, failed_id, capsys)
            assert f"reports to {RUN_ID} (running)" in printed
            assert f"re-entered the buffer of {RUN_ID}" in printed
            status = await run.query(TrainingWorkflow.status)
            assert status.readmitted == 1 and status.readmitted_ids == [failed_id]
            assert status.ledger.failed == 0

            late_before = status.late_results
            again = await replay(client, failed_id)
            assert "counted it late" in await outcome(client, again, timeout_s=120)
            status = await run.query(TrainingWorkflow.status)
            assert status.readmitted == 1 and status.late_results == late_before + 1

            reset = subprocess.run([  # the plain Temporal way does the same
                temporal_binary(), "workflow", "reset", "--address", temporal_server.address,
                "--workflow-id", failed_id, "--type", "FirstWorkflowTask", "--reason", "test"],
                capture_output=True, text=True)
            assert reset.returncode == 0, reset.stderr

            async def late_again():
                status = await run.query(TrainingWorkflow.status)
                return status.late_results == late_before + 2 and status.readmitted == 1

            await until(late_again)

            with pytest.raises(ReplayError, match="not a TrajectoryWorkflow"):
                await replay(client, RUN_ID)
        finally:
            Replayable.gate.set()
        status = await asyncio.wait_for(run.result(), timeout=240)
        batches = await trained_ids_by_iteration(client, RUN_ID)
        trained = [tid for batch in batches.values() for tid in batch]
        assert await failed() == [failed_id]  # the failed run stays, for inspection
        rerun = client.get_workflow_handle(failed_id, result_type=TrajectoryResult)
        assert (await rerun.result()).status == "completed"
    assert trained.count(failed_id) == 1
    assert status.ledger.trained == len(trained) == 6
    assert status.ledger.failed == 0 and status.ledger.in_flight == 0


BATCH_RUN_ID = "replay-batch-member-run"


async def test_a_failed_batch_member_is_rerun_on_its_own_and_reports_to_its_run(
        temporal_server, engine, tmp_path, capsys):
    config = replayable_config(temporal_server, tmp_path, **{
        "algorithm.iterations": 30, "algorithm.rollout_unit": "batch"})
    Replayable.fail_next, Replayable.hold = 1, False
    async with in_process_fleet(config, engine) as client:
        run = await start_run(client, config, BATCH_RUN_ID)
        try:
            batches = (f"WorkflowType = 'BatchRolloutWorkflow' AND RollartRun = '{BATCH_RUN_ID}' "
                       "AND ExecutionStatus = 'Completed' AND RollartFailedIn = 'step'")

            async def with_failures():
                return [w.id async for w in client.list_workflows(batches)]

            [batch_id] = await until(with_failures, timeout_s=120)
            results = await client.get_workflow_handle(
                batch_id, result_type=list[TrajectoryResult]).result()
            [failed_id] = [r.trajectory_id for r in results if r.status == "failed"]
            with pytest.raises(ReplayError, match="no lockstep batch ran a trajectory"):
                await replay(client, f"{BATCH_RUN_ID}.g999999.t00")
            before = await run.query(TrainingWorkflow.status)
            settled_before = before.readmitted + before.late_results

            printed = await replay_from_cli(temporal_server, failed_id, capsys)
            assert f"{failed_id} (failed in lockstep batch {batch_id}, run " in printed
            assert f"reports to {BATCH_RUN_ID} (running)" in printed
            assert "the re-run completed" in printed
            status = await run.query(TrainingWorkflow.status)
            assert status.readmitted + status.late_results == settled_before + 1

            tagged = (f"WorkflowType = 'TrajectoryWorkflow' AND RollartRun = '{BATCH_RUN_ID}' "
                      "AND RollartDomain = 'frozenlake'")

            async def rerun_found():
                return [w.id async for w in client.list_workflows(tagged)]

            assert await until(rerun_found) == [failed_id]
            again = await replay(client, failed_id)  # now a workflow of its own: reset
            assert again.batch_id is None and again.parent_id == BATCH_RUN_ID
            assert "counted it late" in await outcome(client, again, timeout_s=120)
        finally:
            await run.signal("stop")
        status = await asyncio.wait_for(run.result(), timeout=240)
        trained = [tid for ids in (await trained_ids_by_iteration(client, BATCH_RUN_ID)).values()
                   for tid in ids]
    assert trained.count(failed_id) <= 1 and len(trained) == len(set(trained))
    assert status.ledger.in_flight == 0
