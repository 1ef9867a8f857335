"""A generation replica sharded over two tensor-parallel ranks: the same distribution as the
model, before and after an in-place weight update (on CPU, as a GPU pool would run it)."""

from __future__ import annotations

import asyncio

import pytest
import torch
from test_engine import PROMPT, buckets_of, hf_logprob
from transformers import AutoModelForCausalLM

from rollart.config import EngineConfig, PoolConfig, RunConfig
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.engine import cpu_thread_binding


def test_ranks_get_cores_of_their_own_and_share_only_when_there_are_too_few():
    assert cpu_thread_binding(2, [0, 1]) == "0|1"
    assert cpu_thread_binding(2, [0, 1, 2, 3, 4]) == "0,1|2,3"
    assert cpu_thread_binding(4, [6, 7]) == "6|7|6|7"
    assert cpu_thread_binding(1, [0, 1]) == "0,1"


def test_only_real_generation_pools_shard_their_engine():
    with pytest.raises(ValueError, match="only gen pools shard"):
        PoolConfig(name="env", role="env", tensor_parallel_size=2)
    pools = [{"name": "cpu", "role": role} for role in ("env", "reward", "train")]
    pools.append({"name": "cpu", "role": "gen", "tensor_parallel_size": 2})
    assert RunConfig.model_validate({"pools": pools}).pool("gen", "cpu").tensor_parallel_size == 2
    with pytest.raises(ValueError, match="prices a replica by its hardware label"):
        RunConfig.model_validate({"pools": pools, "simulation": {"enabled": True}})


@pytest.mark.slow
@pytest.mark.asyncio(loop_scope="session")
async def test_a_two_rank_engine_samples_the_model_and_takes_weight_updates(model_path):
    """On CPU, too: a GPU pool runs the same code, and the CPU run caught ranks that spun on
    their queues between requests (250 ms of CPU per turn each in a training run)."""
    import psutil

    from rollart.policy.engine import PolicyEngine

    engine = await PolicyEngine(model_path, EngineConfig(), tensor_parallel_size=2).start()
    ranks = [p for p in psutil.Process().children(recursive=True)
             if any("Worker_TP" in part for part in p.cmdline())]
    try:
        assert len(ranks) == 2, [p.cmdline() for p in psutil.Process().children(recursive=True)]
        ids, allowed = engine.encode(PROMPT), engine.single_token_ids(ACTIONS)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        sample = await engine.generate(ids, max_tokens=1, temperature=1.0,
                                       allowed_token_ids=allowed)
        assert sample.logprobs[0] == pytest.approx(
            hf_logprob(model, ids, sample.token_ids[0], allowed), abs=1e-4)

        torch.manual_seed(5)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.2)
        await engine.update_weights(1, buckets_of(model))
        sample = await engine.generate(ids, max_tokens=4, temperature=1.0)
        assert sample.version == 1
        context = list(ids)
        for token, logprob in zip(sample.token_ids, sample.logprobs, strict=True):
            assert logprob == pytest.approx(hf_logprob(model, context, token), abs=1e-3)
            context.append(token)

        def cpu_s() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in ranks)

        used, started = cpu_s(), asyncio.get_running_loop().time()
        for _ in range(30):
            await engine.generate(ids, max_tokens=1, temperature=1.0)
            await asyncio.sleep(0.05)
        share = (cpu_s() - used) / (asyncio.get_running_loop().time() - started)
        print(f"ranks: {share:.2f} of a core while serving every 50 ms")
        assert share < 0.6  # each rank spinning on its queue: ~2
    finally:
        engine.shutdown()
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"tensor-parallel ranks outlived their engine: {alive}"
