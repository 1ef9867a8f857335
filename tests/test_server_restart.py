"""Stopping and restarting the Temporal dev server (SQLite) mid-run: the run resumes where it
was and completes."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from conftest import make_config

from rollart.contracts import TrainingStatus
from rollart.servers import free_port
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import (
    REPLICA_RETRY,
    REPLICA_WAIT,
    TrainingInput,
    TrainingWorkflow,
    replica_wait_rounds,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_run_survives_a_server_restart(engine, tmp_path):
    server = DevServer(tmp_path / "temporal.db", free_port(), None).start()
    try:
        config = make_config(server, tmp_path / "run", **{
            "algorithm.group_size": 2, "algorithm.batch_size": 4, "algorithm.iterations": 4,
            "algorithm.minibatches": 1, "domains.frozenlake.max_turns": 4})
        async with in_process_fleet(config, engine) as client:
            handle = await client.start_workflow(
                TrainingWorkflow.run, TrainingInput(config=config), id="restart-run",
                task_queue=config.temporal.control_queue, result_type=TrainingStatus)
            for _ in range(600):
                status = await handle.query(TrainingWorkflow.status)
                if status.iteration >= 1:
                    break
                await asyncio.sleep(0.1)
            before = status.iteration
            server.stop()
            await asyncio.sleep(2)
            server.start()
            status = await asyncio.wait_for(handle.result(), timeout=240)
            tail = await handle.query(TrainingWorkflow.status, 2)
        assert [m.iteration for m in tail.history] == [2, 3]
        assert before >= 1 and status.iteration == 4 and status.done
        assert status.ledger.in_flight == 0
    finally:
        server.stop()


async def test_the_wait_for_a_replica_counts_rounds_not_the_stacks_downtime():
    """A weight update under way when the whole stack stopped ends, once it is resumed hours
    later, with every replica "missed": that one round may not spend the whole wait."""
    pickup = timedelta(seconds=10)
    rounds = replica_wait_rounds(pickup)
    assert rounds * (pickup + REPLICA_RETRY) >= REPLICA_WAIT
    assert (rounds - 1) * (pickup + REPLICA_RETRY) < REPLICA_WAIT
    assert replica_wait_rounds(timedelta(minutes=10)) == 2  # the first update, engines loading
    assert replica_wait_rounds(timedelta(hours=1)) == 2
