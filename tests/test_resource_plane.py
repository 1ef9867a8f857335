"""Pools, fallback and multi-task training over a real dev server: workers are really stopped and
started, and where each activity ran is read back from the workflow histories."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import pytest
from conftest import make_config
from temporalio.api.enums.v1 import EventType

from rollart.contracts import TrainingStatus, TrajectoryResult, TrajectorySpec
from rollart.workers.fleet import _all, build_workers, in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def activity_queues(client, workflow_id: str) -> dict[str, set[str]]:
    """Activity type -> the task queues it was scheduled on, from the workflow's history."""
    return {name: set(queues) for name, queues in (await schedules(client, workflow_id)).items()}


async def schedules(client, workflow_id: str) -> dict[str, list[str]]:
    """Activity type -> the task queue of each time it was scheduled."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    queues: dict[str, list[str]] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            queues.setdefault(attrs.activity_type.name, []).append(attrs.task_queue.name)
    return queues


def two_pool_config(temporal_server, tmp_path, **overrides):
    return make_config(temporal_server, tmp_path, **{
        "pools": [
            {"name": "cpu", "role": "env"}, {"name": "cpu", "role": "reward"},
            {"name": "cpu", "role": "train"},
            {"name": "fast", "role": "gen", "hardware": "h800"},
            {"name": "backup", "role": "gen", "hardware": "h20"},
        ],
        "domains.frozenlake.env": "corridor", "domains.frozenlake.max_turns": 3,
        "domains.frozenlake.gen_pool": "fast", "domains.frozenlake.gen_fallback": ["backup"],
        "routing.schedule_to_start_s": 2, "routing.down_s": 3,
        **overrides,
    })


@contextlib.asynccontextmanager
async def replica_worker(config, client, engine, pool: str):
    """One generation replica's worker, started and stopped by the test."""
    async with _all(await build_workers(config, client, "gen", pool, 0, engine=engine)):
        yield


async def rollout(client, config, name: str, count: int = 4) -> list[TrajectoryResult]:
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"{name}-{k}", f"{name}-g", seed=k)
             for k in range(count)]
    return await asyncio.gather(*(
        client.execute_workflow(TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                                task_queue=config.temporal.control_queue,
                                result_type=TrajectoryResult)
        for spec in specs))


async def test_fallback_when_a_pool_stops_and_return_when_it_restarts(temporal_server, engine,
                                                                      tmp_path):
    config = two_pool_config(temporal_server, tmp_path)
    rest = config.model_copy(update={"pools": [p for p in config.pools if p.name != "fast"]})
    async with in_process_fleet(rest, engine, ("control", "env", "reward", "gen")) as client:
        async with replica_worker(config, client, engine, "fast"):
            before = await rollout(client, config, "before")
        assert all(r.status == "completed" and r.fallback_turns == 0 for r in before)
        assert (await activity_queues(client, "before-0"))["gen.generate"] == {
            "rollart.gen.fast.r0"}

        # The fast pool's only worker is gone: its requests move to the backup pool.
        during = await rollout(client, config, "during")
        assert all(r.status == "completed" and r.turns == 3 for r in during)
        assert sum(r.fallback_turns for r in during) >= 3 * len(during) - 1
        queues = await activity_queues(client, "during-0")
        assert "rollart.gen.backup.r0" in queues["gen.generate"]

        async with replica_worker(config, client, engine, "fast"):
            await asyncio.sleep(config.routing.down_s)
            after = []
            for attempt in range(5):  # the first request after down_s probes the pool
                after = await rollout(client, config, f"after{attempt}", count=2)
                if all(r.fallback_turns == 0 for r in after):
                    break
        assert all(r.status == "completed" for r in after)
        assert all(r.fallback_turns == 0 for r in after), "traffic did not return to fast"
        assert (await activity_queues(client, f"after{attempt}-0"))["gen.generate"] == {
            "rollart.gen.fast.r0"}


async def test_multitask_run_uses_each_domains_pools(temporal_server, engine, tmp_path):
    config = make_config(temporal_server, tmp_path, **{
        "pools": [
            {"name": "grid", "role": "env"}, {"name": "cpu", "role": "env"},
            {"name": "h800", "role": "gen", "hardware": "h800"},
            {"name": "h20", "role": "gen", "hardware": "h20"},
            {"name": "cpu", "role": "reward"}, {"name": "cpu", "role": "train"},
        ],
        "domains": {
            "frozenlake": {"pool": "grid", "gen_pool": "h800", "gen_fallback": ["h20"],
                           "max_turns": 6},
            "arithmetic": {"pool": "cpu", "gen_pool": "h20", "gen_fallback": ["h800"],
                           "max_turns": 1, "max_tokens_per_turn": 3},
        },
        "algorithm.group_size": 4, "algorithm.batch_size": 16, "algorithm.iterations": 3,
        "algorithm.minibatches": 1,
    })
    async with in_process_fleet(config, engine) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="multitask",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus,
        )
        trained = {}
        for m in status.history:
            for name, domain in m.domains.items():
                trained[name] = trained.get(name, 0) + domain.trajectories
                assert domain.fallback_turns == 0
        assert set(trained) == {"frozenlake", "arithmetic"}, trained
        assert status.ledger.in_flight == 0
        assert status.ledger.trained == status.ledger.started - status.ledger.failed \
            - status.ledger.evicted
        replicas = {q for m in status.history for q, r in m.replicas.items() if r.requests}
        assert replicas == {"rollart.gen.h800.r0", "rollart.gen.h20.r0"}

        children = [w.id async for w in client.list_workflows(
            "WorkflowType='TrajectoryWorkflow' AND ExecutionStatus='Completed' "
            "AND WorkflowId STARTS_WITH 'multitask'")]
        seen = {}
        for child in children:
            result = await client.get_workflow_handle(
                child, result_type=TrajectoryResult).result()
            if result.domain not in seen:
                seen[result.domain] = await activity_queues(client, child)
    lake, arith = seen["frozenlake"], seen["arithmetic"]
    assert lake["gen.generate"] == {"rollart.gen.h800.r0"}
    assert arith["gen.generate"] == {"rollart.gen.h20.r0"}
    assert next(iter(lake["env.reset"])) == "rollart.env.grid"
    assert next(iter(arith["env.reset"])) == "rollart.env.cpu"


def saturated_config(temporal_server, tmp_path, replicas: int):
    """Two generate slots per replica worker, a 1 s pickup timeout, 3-turn trajectories."""
    return make_config(temporal_server, tmp_path, **{
        "pools": [{"name": "cpu", "role": "env"}, {"name": "cpu", "role": "reward"},
                  {"name": "cpu", "role": "train"},
                  {"name": "cpu", "role": "gen", "replicas": replicas}],
        "engine.max_num_seqs": 2, "routing.schedule_to_start_s": 1,
        "domains.frozenlake.env": "corridor", "domains.frozenlake.max_turns": 3,
    })


async def saturate(client, config, engine, name: str, count: int, hold_s: float):
    """`count` trajectories while the engine is paused for `hold_s`: the requests inside hold
    every slot (and must keep heartbeating), the others wait in the replicas' queues."""
    await engine.llm.pause_generation(mode="keep", clear_cache=False)
    try:
        runs = asyncio.ensure_future(rollout(client, config, name, count))
        await asyncio.sleep(hold_s)
    finally:
        await engine.llm.resume_generation()
    return await runs


async def test_a_saturated_replica_is_busy_not_dead(temporal_server, engine, tmp_path, caplog):
    """Requests that wait in full queues past the pickup timeout are sent again, to replicas
    that answer pings: none is marked down, nothing fails, and each waiting turn is sent again
    only a few times (the pickup timeout doubles), not in a storm."""
    config = saturated_config(temporal_server, tmp_path, replicas=2)
    caplog.set_level(logging.WARNING, "rollart.router")
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        results = await saturate(client, config, engine, "busy", count=12, hold_s=12)
        sends = [len((await schedules(client, r.trajectory_id))["gen.generate"])
                 for r in results]
    assert all(r.status == "completed" and r.turns == 3 for r in results)
    assert "marked down" not in caplog.text
    assert sum(r.rerouted_turns for r in results) > 0  # the wait did pass the pickup timeout
    # pickups of 1, 2, 4 and 8 s cover the 12 s hold: at most 4 more sends per waiting turn
    assert max(sends) <= 3 + 4 and sum(sends) <= 12 * 3 + 8 * 4


async def test_the_only_replica_is_waited_for_never_resent(temporal_server, engine, tmp_path,
                                                            caplog):
    config = saturated_config(temporal_server, tmp_path, replicas=1)
    caplog.set_level(logging.WARNING, "rollart.router")
    async with in_process_fleet(config, engine, ("control", "env", "reward", "gen")) as client:
        results = await saturate(client, config, engine, "only", count=8, hold_s=4)
    assert all(r.status == "completed" and r.turns == 3 for r in results)
    assert sum(r.rerouted_turns for r in results) == 0
    assert "marked down" not in caplog.text

