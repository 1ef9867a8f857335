"""SuffixDecoding speculation on the real engine: exact logprobs and sampling, and the run-time
switch that turns it off under load."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
import pytest_asyncio
import torch
from transformers import AutoModelForCausalLM

from rollart.config import EngineConfig, SpeculationConfig
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.speculation_gate import LEARNED, SpeculationGate

pytestmark = pytest.mark.asyncio(loop_scope="session")
PROMPT = "P F F F | F H F H | F F F H | H F F G"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def speculating(model_path):
    from rollart.policy.engine import PolicyEngine

    engine = await PolicyEngine(model_path, EngineConfig(),
                                speculation=SpeculationConfig(max_running_requests=None)).start()
    yield engine
    engine.shutdown()


async def sample_many(engine, ids: list[int], count: int, tokens: int) -> list:
    outs = []
    for _ in range(0, count, 250):
        outs += await asyncio.gather(*[engine.generate(ids, max_tokens=tokens, temperature=1.0,
                                                       ignore_eos=True) for _ in range(250)])
    return outs


def chi_square_p(a: Counter, b: Counter) -> float:
    """Two-sample chi-square test of homogeneity; the p-value."""
    keys = sorted(set(a) | set(b))
    na, nb = sum(a.values()), sum(b.values())
    statistic = 0.0
    for key in keys:
        column = a[key] + b[key]
        for count, total in ((a[key], na), (b[key], nb)):
            expected = total * column / (na + nb)
            statistic += (count - expected) ** 2 / expected
    df = torch.tensor((len(keys) - 1) / 2, dtype=torch.float64)
    return torch.special.gammaincc(df, torch.tensor(statistic / 2, dtype=torch.float64)).item()


async def test_speculated_tokens_carry_the_models_own_logprobs(speculating, model_path):
    """Every emitted token, drafted and accepted or sampled, with and without an allowed-token
    mask: the engine's logprob is the trainer's recomputed one."""
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ids = speculating.encode(PROMPT)
    allowed = speculating.single_token_ids(ACTIONS)
    before = await speculating.speculation_counters()
    for mask in (None, allowed):
        for _ in range(3):
            sample = await speculating.generate(ids, max_tokens=40, temperature=1.0,
                                                allowed_token_ids=mask, ignore_eos=True)
            with torch.no_grad():
                logits = model(torch.tensor([ids + sample.token_ids])).logits[0, len(ids) - 1:-1]
            if mask is not None:
                blocked = torch.ones(logits.shape[-1], dtype=torch.bool)
                blocked[mask] = False
                logits = logits.masked_fill(blocked, float("-inf"))
            expected = torch.log_softmax(logits.float(), -1).gather(
                -1, torch.tensor(sample.token_ids)[:, None]).squeeze(-1)
            assert torch.allclose(torch.tensor(sample.logprobs), expected, atol=1e-4)
    after = await speculating.speculation_counters()
    assert after["verify_steps"] - before["verify_steps"] > 50  # it did speculate
    assert after["accepted_tokens"] > before["accepted_tokens"]


async def test_speculation_samples_the_models_distribution(speculating, engine):
    """Temperature 1: 1,000 episodes of 4 tokens per engine, the token at each position compared
    between the speculating engine and a plain one (chi-square, 32 tokens). Positions are tested
    separately because tokens of one episode are not independent. Without the CPU fix of the
    rejection sampler (rollart.policy.vllm_extension) position 1 gave p = 4.5e-55."""
    ids = speculating.encode(PROMPT)
    plain, speculated = await asyncio.gather(sample_many(engine, ids, 1000, 4),
                                             sample_many(speculating, ids, 1000, 4))
    for position in range(4):
        p = chi_square_p(Counter(s.token_ids[position] for s in plain),
                         Counter(s.token_ids[position] for s in speculated))
        assert p > 1e-3, f"position {position}: the distributions differ (p={p:.2g})"


async def test_speculation_turns_off_above_its_load_threshold_and_back_on(speculating):
    ids = speculating.encode(PROMPT)
    switches = (await speculating.speculation_counters())["switches"]
    speculating.gate = SpeculationGate(2)
    try:
        states = []

        async def watch():
            while True:
                states.append(speculating.speculating)
                await asyncio.sleep(0.01)

        watcher = asyncio.ensure_future(watch())
        await sample_many(speculating, ids, 250, 16)
        watcher.cancel()
        assert False in states  # off while 250 ran
        for _ in range(100):
            if speculating.speculating:
                break
            await asyncio.sleep(0.05)
        assert speculating.speculating  # on again once idle
        counters = await speculating.speculation_counters()
        assert counters["on"] == 1 and counters["switches"] >= switches + 2
        # off, a step drafts nothing
        await speculating.llm.collective_rpc("set_speculation", args=(False,))
        drafted = (await speculating.speculation_counters())["draft_tokens"]
        speculating.gate = SpeculationGate(None)
        await speculating.generate(ids, max_tokens=32, temperature=1.0, ignore_eos=True)
        assert (await speculating.speculation_counters())["draft_tokens"] == drafted
    finally:
        speculating.gate = SpeculationGate(None)
        await speculating.llm.collective_rpc("set_speculation", args=(True,))
        speculating.speculating = True


async def test_the_learned_gate_measures_both_sides_at_the_engines_load(speculating):
    """The engine feeds the gate what it emits and follows it: under a steady load of 250
    requests both sides get measured, so the gate's choice rests on tokens/s it saw."""
    ids = speculating.encode(PROMPT)
    speculating.gate = SpeculationGate(LEARNED, window_s=0.05, windows_to_decide=2)
    try:
        await sample_many(speculating, ids, 500, 48)
        rates = speculating.gate.rates()
        busy = SpeculationGate.bucket(250)
        assert rates.get(f"{busy}:on", 0) > 0 and rates.get(f"{busy}:off", 0) > 0, rates
    finally:
        speculating.gate = SpeculationGate(None)
        await speculating.llm.collective_rpc("set_speculation", args=(True,))
        speculating.speculating = True
