"""The vLLM engine's side of token-in/token-out and in-place weight updates."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from rollart.envs.frozenlake import ACTIONS
from rollart.weights.transfer import pack

PROMPT = "P F F F | F H F H | F F F H | H F F G"


def buckets_of(model) -> list[bytes]:
    return [blob for blob, _ in pack(model.named_parameters(), bucket_bytes=2**16)]


def hf_logprob(model, ids: list[int], token: int, allowed: list[int] | None = None) -> float:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].float()
    if allowed is not None:
        masked = torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        logits = masked
    return torch.log_softmax(logits, -1)[token].item()


@pytest.mark.asyncio(loop_scope="session")
async def test_constrained_sampling_reports_the_sampling_distribution(engine, model_path):
    allowed = engine.single_token_ids(ACTIONS)
    ids = engine.encode(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    seen = {}
    for _ in range(40):
        sample = await engine.generate(ids, max_tokens=1, temperature=1.0,
                                       allowed_token_ids=allowed)
        assert sample.token_ids[0] in allowed
        seen[sample.token_ids[0]] = sample.logprobs[0]
    assert len(seen) >= 2
    for token, logprob in seen.items():
        assert logprob == pytest.approx(hf_logprob(model, ids, token, allowed), abs=1e-4)


@pytest.mark.asyncio(loop_scope="session")
async def test_weight_update_takes_effect_in_place(engine, model_path, tmp_path):
    """Regression: vLLM's CPU build repacks linear weights, so a plain in-place reload left the
    engine sampling from stale weights."""
    ids = engine.encode(PROMPT)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(3)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.2)
    version = engine.version + 1
    await engine.update_weights(version, buckets_of(model))
    try:
        sample = await engine.generate(ids, max_tokens=4, temperature=1.0)
        assert sample.version == version
        context = list(ids)
        for token, logprob in zip(sample.token_ids, sample.logprobs, strict=True):
            assert logprob == pytest.approx(hf_logprob(model, context, token), abs=1e-3)
            context.append(token)
    finally:
        original = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        await engine.update_weights(0, buckets_of(original))
    restored = await engine.generate(ids, max_tokens=1, temperature=1.0)
    assert math.isclose(restored.logprobs[0],
                        hf_logprob(original, ids, restored.token_ids[0]), abs_tol=1e-4)


def test_multi_token_actions_are_refused_for_constrained_decoding(engine):
    with pytest.raises(ValueError, match="constrain_to_actions"):
        engine.single_token_ids(["Left Right"])


@pytest.mark.asyncio(loop_scope="session")
async def test_missing_weights_fail_clearly_and_leave_the_engine_serving(engine, tmp_path):
    from temporalio.exceptions import ApplicationError
    from temporalio.testing import ActivityEnvironment

    from rollart.activities.generate import GenerateActivities
    from rollart.blobs import LocalBlobs
    from rollart.contracts import UpdateWeightsRequest
    from rollart.weights import Puller

    version = engine.version
    activities = GenerateActivities(engine, Puller(LocalBlobs(tmp_path)))
    with pytest.raises(ApplicationError, match="weights v99 are not published under gone"):
        await ActivityEnvironment().run(activities.update_weights,
                                        UpdateWeightsRequest(version=99, weights_prefix="gone"))
    assert engine.version == version
    sample = await engine.generate(engine.encode(PROMPT), max_tokens=1, temperature=1.0)
    assert sample.version == version


@pytest.mark.asyncio(loop_scope="session")
async def test_a_request_in_flight_continues_under_the_new_version(engine, model_path):
    original = buckets_of(AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32))
    """Suspend -> update -> resume: the request keeps the tokens it had and samples the rest
    under the new weights; each token records the version that sampled it."""
    before = engine.version
    request = asyncio.ensure_future(engine.generate(
        engine.encode(PROMPT), max_tokens=400, temperature=1.0, ignore_eos=True,
        request_id="in-flight-1"))
    for _ in range(2000):
        progress = engine._in_flight.get("in-flight-1")
        if progress is not None and progress.produced >= 5:
            break
        await asyncio.sleep(0.002)
    await engine.update_weights(before + 1, original)
    sample = await request
    assert len(sample.token_ids) == 400
    assert sample.versions[0] == before and sample.versions[-1] == before + 1
    switch = sample.versions.index(before + 1)
    assert 5 <= switch < 400
    assert sample.versions == [before] * switch + [before + 1] * (400 - switch)
    assert all(math.isfinite(lp) for lp in sample.logprobs)


@pytest.mark.asyncio(loop_scope="session")
async def test_requests_sharing_the_engine_are_charged_their_share_of_it(engine):
    """What the online profiler learns a pool's rates from: a request alone is charged its whole
    time, two together about half each, and the charges add up to the time the engine was busy."""
    loop = asyncio.get_running_loop()

    async def timed(*request_ids: str) -> tuple[list, float]:
        started = loop.time()
        samples = await asyncio.gather(*(engine.generate(
            engine.encode(PROMPT), max_tokens=64, temperature=1.0, ignore_eos=True,
            request_id=request_id) for request_id in request_ids))
        return samples, loop.time() - started

    (alone,), alone_s = await timed("share-alone")
    pair, pair_s = await timed("share-a", "share-b")
    assert alone.prefill_s > 0 and alone.decode_s > 0
    assert alone.prefill_s + alone.decode_s == pytest.approx(alone_s, rel=0.1)
    charged = [s.prefill_s + s.decode_s for s in pair]
    assert sum(charged) == pytest.approx(pair_s, rel=0.1)
    assert max(charged) < 0.7 * pair_s


@pytest.mark.asyncio(loop_scope="session")
async def test_an_engine_serving_now_and_then_does_not_hold_a_core(engine):
    """vLLM's separate worker process busy-loops for a second after each message on its
    shared-memory queue, so an engine that serves a request every 20 ms held a core (measured:
    that worker used 28 ms of CPU per such request); the model runs in the engine core's
    process instead, which waits on its socket."""
    import psutil

    engine_processes = [p for p in psutil.Process().children(recursive=True)
                        if any("VLLM::" in part for part in p.cmdline())]
    assert engine_processes, "no vLLM engine processes under the test process"

    def cpu_s() -> float:
        return sum(sum(p.cpu_times()[:2]) for p in engine_processes)

    prompt = engine.encode(PROMPT)
    used, started = cpu_s(), asyncio.get_running_loop().time()
    for _ in range(50):
        await engine.generate(prompt, max_tokens=1, temperature=1.0)
        await asyncio.sleep(0.02)
    wall = asyncio.get_running_loop().time() - started
    share = (cpu_s() - used) / wall
    print(f"engine processes: {share:.2f} of a core while serving every 20 ms")
    assert share < 0.6  # busy-looping engine core and worker: ~1.3


SERVE_UNTIL_KILLED = """
import asyncio, sys
from rollart.config import EngineConfig
from rollart.policy.engine import PolicyEngine

async def main():
    await PolicyEngine(sys.argv[1], EngineConfig()).start()
    print("ready", flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


def test_an_engine_core_exits_when_its_generation_worker_is_killed(model_path, tmp_path):
    """SIGKILL to a generation worker alone (as the OOM killer sends it, or the kernel to
    workers whose launcher died) used to leave its engine core running under init, holding the
    model: each restart of the worker added one."""
    import signal
    import subprocess
    import sys

    import psutil

    log = open(tmp_path / "worker.log", "w")  # noqa: SIM115 (the worker writes it)
    worker = subprocess.Popen([sys.executable, "-c", SERVE_UNTIL_KILLED, model_path],
                              stdout=subprocess.PIPE, stderr=log, text=True)
    engines: list[psutil.Process] = []
    try:
        lines = iter(worker.stdout.readline, "")  # vLLM logs to stdout too
        assert "ready" in (line.strip() for line in lines), (tmp_path / "worker.log").read_text()
        engines = [p for p in psutil.Process(worker.pid).children(recursive=True)
                   if any("VLLM::" in part for part in p.cmdline())]
        assert engines, "no vLLM engine process under the worker"
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        _, alive = psutil.wait_procs(engines, timeout=15)
        assert not alive, f"engine processes outlived their worker: {alive}"
    finally:
        worker.kill()
        log.close()
        for process in engines:
            with contextlib.suppress(psutil.Error):
                process.kill()
