"""Simulated compute: the cost model's arithmetic, the simulated engine's batching, prefix cache
and weight updates, and whole training runs (every mode, lockstep included) on the real dev
server with simulated replicas and trainer."""

from __future__ import annotations

import asyncio
import time

import pytest
from conftest import make_config
from pydantic import ValidationError
from temporalio.exceptions import ApplicationError

from rollart.activities.env import EnvActivities
from rollart.config import EngineConfig, InjectedFaults, SimulationConfig, load_config
from rollart.contracts import EnvResetRequest, EnvStepRequest, TrainingStatus
from rollart.simulation.costs import CostModel, train_cost
from rollart.simulation.engine import Device, SimulatedEngine
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow

SIM = SimulationConfig()


def test_decode_is_memory_bound_and_prefill_compute_bound():
    h800, h20 = (CostModel(SIM, SIM.hardware[k]) for k in ("h800", "h20"))
    # batch 1: read 16 GB of weights at 70% of 3.35 TB/s
    assert h800.step_s(1, 0) == pytest.approx(16e9 / (3.35e12 * 0.7))
    assert h20.step_s(1, 0) < h800.step_s(1, 0)  # more bandwidth
    # 4k prompt tokens in one step: 2 x 8e9 FLOPs each at 50% of peak
    assert h800.step_s(4096, 0) == pytest.approx(4096 * 16e9 / (989e12 * 0.5))
    assert h20.step_s(4096, 0) / h800.step_s(4096, 0) == pytest.approx(989 / 148)
    # KV cache reads add to a decode step
    assert h800.step_s(1, 100_000) > h800.step_s(1, 0)


def test_train_and_transfer_costs():
    cost = train_cost(SIM)
    per_token = 6 * 8e9 / (989e12 * 0.35 * SIM.train_gpus)
    assert cost.train_s(1e6) == pytest.approx(SIM.train_fixed_s + 1e6 * per_token)
    assert cost.transfer_s() == pytest.approx(16e9 / 25e9)
    assert cost.load_s() == pytest.approx(16e9 / 20e9)


def test_a_gen_pool_needs_a_described_hardware():
    with pytest.raises(ValidationError, match="hardware 'cpu', which simulation.hardware"):
        load_config(None, **{"simulation.enabled": True})
    with pytest.raises(ValidationError, match="train_hardware: unknown hardware 'TPU'"):
        SimulationConfig(train_hardware="TPU")


async def simulated_engine(model_path, **sim) -> SimulatedEngine:
    config = SimulationConfig(**{"time_scale": 0.05, "answer_token_scale": 32, **sim})
    return await SimulatedEngine(model_path, EngineConfig(max_num_seqs=64), config,
                                 "h800").start()


async def test_concurrent_decodes_share_steps(model_path):
    """Memory-bound decode: 32 requests together take about as long as one alone, and each is
    charged its share of the steps (what the online profiler learns rates from)."""
    engine = await simulated_engine(model_path)
    try:
        allowed = engine.single_token_ids(["Left", "Right"])

        async def one(prompt):
            return await engine.generate(prompt, max_tokens=4, temperature=1.0,
                                         allowed_token_ids=allowed, ignore_eos=True)

        started = time.perf_counter()
        alone = await one([3, 4, 5])
        single_s = time.perf_counter() - started
        alone_busy_s = engine.busy_s
        started = time.perf_counter()
        together = await asyncio.gather(*(one([3, 4, 5, k]) for k in range(32)))
        batch_s = time.perf_counter() - started
        charged = [s.prefill_s + s.decode_s for s in together]
        assert alone.prefill_s + alone.decode_s == pytest.approx(alone_busy_s)
        assert sum(charged) == pytest.approx(engine.busy_s - alone_busy_s)
        assert max(s.decode_s for s in together) < alone.decode_s / 8
        # 4 tokens x 32 (token_scale) decode steps of ~6.8 ms, x 0.05
        assert 0.03 < single_s < 0.2
        assert batch_s < 2.5 * single_s
        assert len(alone.token_ids) == 4 and set(alone.token_ids) <= set(allowed)
        assert all(s.versions == [0] * 4 for s in together)
        assert alone.logprobs == [pytest.approx(-0.6931, abs=1e-3)] * 4
    finally:
        engine.shutdown()


async def test_a_judge_on_the_policys_device_takes_turns_with_it(model_path):
    """Two engines on one device step one at a time (a judge colocated with the policy): the
    policy's decode then lasts about as long as both; on a device of its own, as long as its
    own."""
    config = SimulationConfig(time_scale=0.2, answer_token_scale=32, judge_prompt_tokens=2048,
                              judge_tokens=128)

    async def policy_s(shared: bool) -> float:
        device = Device()
        policy, judge = [await SimulatedEngine(model_path, EngineConfig(), config, "h800",
                                               device=device if k == 0 or shared else None
                                               ).start() for k in range(2)]
        try:
            started = time.perf_counter()
            verdict = asyncio.ensure_future(judge.next_token_distribution([3, 4, 5], [3, 4]))
            await policy.generate([3, 4, 5], max_tokens=4, temperature=1.0,
                                  allowed_token_ids=[3, 4], ignore_eos=True)
            took = time.perf_counter() - started
            assert sum(await verdict) == pytest.approx(1.0)
            return took
        finally:
            policy.shutdown()
            judge.shutdown()

    alone, shared = await policy_s(False), await policy_s(True)
    # 128 decode steps of ~6.8 ms each, x 0.2: about 0.17 s alone
    assert 0.1 < alone < 0.4 and shared > 1.6 * alone


async def test_a_turn_that_stays_hits_the_prefix_cache(model_path):
    engine = await simulated_engine(model_path)
    try:
        context = list(range(3, 30)) * 2  # 54 tokens: three full blocks of 16
        first = await engine.generate(context, max_tokens=1, temperature=1.0,
                                      allowed_token_ids=[3])
        second = await engine.generate(context + first.token_ids + [5, 6], max_tokens=1,
                                       temperature=1.0, allowed_token_ids=[3])
        assert first.cached_tokens == 0 and second.cached_tokens == 48
    finally:
        engine.shutdown()


async def test_an_update_suspends_loads_and_switches_versions_mid_request(model_path):
    engine = await simulated_engine(model_path, time_scale=0.2)
    try:
        request = asyncio.ensure_future(engine.generate(
            [3, 4], max_tokens=64, temperature=1.0, allowed_token_ids=[3, 4], ignore_eos=True))
        await asyncio.sleep(0.5)  # decoding: 64 x 32 steps of ~6.8 ms x 0.2 = ~2.8 s
        suspended = await engine.update_weights(1, [])
        sample = await request
        load_s = engine.cost.load_s() * 0.2  # 16 GB at 20 GB/s, scaled
        assert load_s <= suspended < load_s + 0.3  # a sleep may overshoot on a busy machine
        assert engine.version == 1 and sample.versions[0] == 0 and sample.versions[-1] == 1
    finally:
        engine.shutdown()


def test_gaussian_step_latency_and_reset_failures():
    envs = EnvActivities("q")
    failing = InjectedFaults(reset_failure_rate=1.0)
    with pytest.raises(ApplicationError) as err:
        envs.reset(EnvResetRequest(trajectory_id="t", env_name="frozenlake", seed=0,
                                   faults=failing))
    assert err.value.type == "InjectedFault" and not err.value.non_retryable
    envs.reset(EnvResetRequest(trajectory_id="t", env_name="frozenlake", seed=0))
    gaussian = InjectedFaults(step_mean_s=0.2, step_std_s=0.0)
    started = time.perf_counter()
    envs.step(EnvStepRequest(trajectory_id="t", action="Down", faults=gaussian))
    assert 0.2 <= time.perf_counter() - started < 0.5


def sim_config(temporal_server, tmp_path, **overrides):
    return make_config(temporal_server, tmp_path, **{
        "simulation.enabled": True, "simulation.time_scale": 0.01,
        "pools": [{"name": "cpu", "role": r} for r in ("env", "reward", "train")]
        + [{"name": "cpu", "role": "gen", "hardware": "h800", "replicas": 2}],
        "algorithm.group_size": 4, "algorithm.batch_size": 8, "algorithm.minibatches": 1,
        "algorithm.iterations": 3, "trainer.checkpoint_every": 0,
        "domains.frozenlake.faults": {"step_mean_s": 0.05, "step_std_s": 0.05,
                                      "reset_failure_rate": 0.2},
        # 8 attempts: a trajectory fails its reset with probability 0.2^8 (3e-6), not 0.2^3
        "domains.frozenlake.timeouts": {"attempts": 8, "first_retry_s": 0.05},
        **overrides})


@pytest.mark.parametrize("mode", ["lockstep", "sync", "async"])
async def test_every_mode_trains_on_simulated_compute(temporal_server, tmp_path, mode):
    config = sim_config(temporal_server, tmp_path, **{"algorithm.mode": mode})
    async with in_process_fleet(config) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id=f"sim-{mode}",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    ledger = status.ledger
    assert status.iteration == 3 and status.version == 3 and ledger.failed == 0
    assert ledger.trained == 24
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    assert all(m.train_s > 0 and m.trajectories == 8 for m in status.history)
    if mode != "async":
        assert all(m.lag_max == 0 for m in status.history)
    replicas = {name for m in status.history for name in m.replicas}
    assert len(replicas) == 2  # every replica took every update


@pytest.mark.parametrize(("std_s", "batched"), [(0.0, True), (0.3, False)])
async def test_auto_batches_rollout_only_while_env_steps_take_nearly_the_same_time(
        temporal_server, tmp_path, std_s, batched):
    config = sim_config(temporal_server, tmp_path, **{
        "algorithm.rollout_unit": "auto", "algorithm.iterations": 5,
        "domains.frozenlake.faults": {"step_mean_s": 0.02, "step_std_s": std_s}})
    run_id = f"sim-auto-{std_s}"
    async with in_process_fleet(config) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id=run_id,
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        batches = [w async for w in client.list_workflows(
            f"WorkflowType = 'BatchRolloutWorkflow' AND WorkflowId STARTS_WITH '{run_id}.'")]
    ledger = status.ledger
    assert status.iteration == 5 and ledger.failed == 0
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    assert bool(batches) == batched
    if batched:  # measured first, one workflow per trajectory: the first batch was not batched
        assert min(int(w.id.split(".g")[1][:6]) for w in batches) >= 2


async def test_a_streaming_batch_trains_on_what_is_ready_after_its_deadline(temporal_server,
                                                                             tmp_path):
    """Groups of a slow domain hold a blocking batch back; a streaming one trains without
    them once its deadline passes, and every trajectory is still accounted for."""
    fast = {"env": "frozenlake", "faults": {"step_mean_s": 0.02}}
    slow = {"env": "frozenlake", "weight": 2.0, "faults": {"slow_reset_share": 1.0,
                                                            "slow_reset_s": 2.0}}
    config = sim_config(temporal_server, tmp_path, **{
        "domains": {"fast": fast, "slow": slow}, "algorithm.mode": "async",
        "algorithm.iterations": 5, "algorithm.batch_policy": "streaming",
        "algorithm.batch_deadline_s": 0.3, "algorithm.streaming_min_share": 0.5})
    async with in_process_fleet(config) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="sim-streaming",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    ledger = status.ledger
    assert status.iteration == 5 and ledger.failed == 0
    assert ledger.started == ledger.trained + ledger.failed + ledger.evicted
    sizes = [m.trajectories for m in status.history]
    assert set(sizes) <= {4, 8} and 4 in sizes  # half batches (one group of two) happened


async def test_the_profiler_moves_lengthening_answers_to_the_bandwidth_pool(temporal_server,
                                                                           tmp_path):
    """Both domains start on one H800 replica; answers lengthen with every version. With
    routing.remap the profiler moves arithmetic to the idle H20 pool (once the prediction has
    beaten the mapping for remap_patience iterations) and its turns are served there after."""
    domains = {"frozenlake": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 4},
               "arithmetic": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 1,
                              "kwargs": {"digits": 3, "terms": 4}}}
    config = sim_config(temporal_server, tmp_path, **{
        "domains": domains, "algorithm.mode": "sync", "algorithm.iterations": 5,
        "pools": [{"name": "cpu", "role": r} for r in ("env", "reward", "train")]
        + [{"name": "h800", "role": "gen", "hardware": "h800"},
           {"name": "h20", "role": "gen", "hardware": "h20", "replicas": 2}],
        "simulation.answer_token_scale": 64, "simulation.answer_growth": 4.0,
        "routing.remap": True, "routing.remap_patience": 2})
    async with in_process_fleet(config) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="sim-remap",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    profiles = [m.profile for m in status.history]
    assert all(p is not None and p.pools for p in profiles)
    assert profiles[0].mapping == {"frozenlake": "h800", "arithmetic": "h800"}
    moved = next(k for k, p in enumerate(profiles) if p.remapped)
    assert moved >= 1 and profiles[moved].recommended["arithmetic"] == "h20"
    assert profiles[moved].recommended["frozenlake"] == "h800"
    assert moved < len(profiles) - 1
    assert all(p.mapping["arithmetic"] == "h20" for p in profiles[moved + 1:])
    assert "h20" in profiles[-1].pools  # measured: it served turns
    assert status.ledger.failed == 0
