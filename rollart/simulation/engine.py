"""A generation replica that spends time by the cost model instead of running a model.

It keeps PolicyEngine's interface (token ids in, sampled ids, behaviour logprobs and versions
out) so the generate activities, the router and the weight path treat it as a real replica.
Requests are continuously batched: the running set advances together, one engine step at a time
(see rollart.simulation.costs), at most `max_num_seqs` at once, the rest waiting. Prompts hit a
block prefix cache as in vLLM, so a turn that stays on its replica prefills only its new tokens.
The policy samples uniformly among the allowed tokens: the figures it serves are system figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import time
from collections import OrderedDict
from dataclasses import dataclass, field

from rollart.config import EngineConfig, SimulationConfig
from rollart.policy.engine import PolicyEngine, Sample
from rollart.simulation.costs import CostModel

BLOCK = 16  # real tokens per prefix-cache block
CACHED_BLOCKS = 1 << 16
EPS = 1e-9


@dataclass
class _Request:
    prefill: float  # simulated prompt tokens still to prefill
    decode: float  # simulated output tokens still to decode
    output_tokens: int  # real tokens this request returns
    output_scale: float  # simulated tokens per real output token
    done: asyncio.Future
    context: float = 0.0  # simulated tokens held in KV cache
    switches: list[tuple[int, int]] = field(default_factory=list)
    prefill_s: float = 0.0  # engine seconds charged to its prefill ...
    decode_s: float = 0.0  # ... and to its decoding: its tokens' share of each step

    def produced(self) -> int:
        """Real output tokens sampled so far."""
        return min(self.output_tokens,
                   int(self.output_tokens - self.decode / self.output_scale + EPS))

    def steps_in_phase(self, chunk: int) -> float:
        return math.ceil(self.prefill / chunk - EPS) if self.prefill > EPS else self.decode


class Device:
    """One accelerator that several simulated engines share (a judge colocated with the
    policy): one engine steps at a time, and while another waits, each holds it for at most
    QUANTUM_S of simulated time, so their steps interleave as two processes' kernels would."""

    QUANTUM_S = 0.05

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.waiting = 0
        self._holder: asyncio.Event | None = None

    @contextlib.asynccontextmanager
    async def held(self, wake: asyncio.Event):
        """Hold the device; `wake` is set when another engine starts waiting for it."""
        self.waiting += 1
        if self._holder is not None:
            self._holder.set()
        try:
            await self.lock.acquire()
        finally:
            self.waiting -= 1
        self._holder = wake
        try:
            yield
        finally:
            self._holder = None
            self.lock.release()


class SimulatedEngine(PolicyEngine):
    def __init__(self, model_path: str, config: EngineConfig, simulation: SimulationConfig,
                 hardware: str, seed: int = 0, device: Device | None = None) -> None:
        super().__init__(model_path, config, seed)
        self.device = device or Device()
        self.simulation = simulation
        self.cost = CostModel(simulation, simulation.hardware[hardware])
        self.rng = random.Random(seed)
        self._running: list[_Request] = []
        self._waiting: list[_Request] = []
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self._wake = asyncio.Event()
        self._paused = False
        self._loop_task: asyncio.Task | None = None
        self.busy_s = 0.0  # wall seconds with at least one request running

    async def start(self) -> SimulatedEngine:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self._loop_task = asyncio.get_running_loop().create_task(self._run())
        return self

    def shutdown(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            self._loop_task = None

    @property
    def running_requests(self) -> int:
        return len(self._running) + len(self._waiting)

    async def generate(self, prompt_ids: list[int], *, max_tokens: int, temperature: float,
                       allowed_token_ids: list[int] | None = None,
                       request_id: str | None = None, ignore_eos: bool = False) -> Sample:
        token_ids = self._sample(max_tokens, allowed_token_ids, ignore_eos)
        choices = len(allowed_token_ids) if allowed_token_ids else self.tokenizer.vocab_size
        cached = self._cached_prefix(prompt_ids)
        scale = self.simulation.token_scale
        action = max_tokens == 1 and allowed_token_ids is not None
        output_scale = scale if action else self.simulation.answer_token_scale * (
            1 + self.simulation.answer_growth * max(self.version, 0))
        start_version = self.version
        request = _Request(prefill=max(len(prompt_ids) - cached, 1) * scale,
                           decode=len(token_ids) * output_scale, output_tokens=len(token_ids),
                           output_scale=output_scale,
                           done=asyncio.get_running_loop().create_future(),
                           context=cached * scale)
        await self._serve(request)
        self._remember(prompt_ids + token_ids)
        versions = [start_version] * len(token_ids)
        for index, version in request.switches:
            versions[index:] = [version] * (len(token_ids) - index)
        eos = self.tokenizer.eos_token_id
        return Sample(token_ids=token_ids, logprobs=[-math.log(choices)] * len(token_ids),
                      finish_reason="stop" if token_ids and token_ids[-1] == eos else "length",
                      cached_tokens=cached, versions=versions,
                      prefill_s=request.prefill_s, decode_s=request.decode_s)

    async def next_token_distribution(self, prompt_ids: list[int],
                                      token_ids: list[int]) -> list[float]:
        """A reward model's verdict: `judge_prompt_tokens` prefilled (the episode), then
        `judge_tokens` decoded. The verdict distribution is drawn at random: the figures are
        system figures."""
        judge_tokens = self.simulation.judge_tokens
        request = _Request(prefill=self.simulation.judge_prompt_tokens,
                           decode=judge_tokens, output_tokens=1, output_scale=judge_tokens,
                           done=asyncio.get_running_loop().create_future())
        await self._serve(request)
        weights = [self.rng.random() + EPS for _ in token_ids]
        total = sum(weights)
        return [w / total for w in weights]

    async def _serve(self, request: _Request) -> None:
        """Queue the request and wait until the step loop has run it to its end."""
        self._waiting.append(request)
        self._wake.set()
        try:
            await request.done
        finally:
            for queue in (self._waiting, self._running):
                if request in queue:
                    queue.remove(request)

    async def update_weights(self, version: int, buckets: list[bytes]) -> float:
        """The pull goes on while this replica keeps generating, then it suspends to load the
        version, and requests in flight recompute their KV cache under it (as RollArt does)."""
        scale = self.simulation.time_scale
        async with self._update_lock:
            await asyncio.sleep(self.cost.transfer_s() * scale)
            started = time.perf_counter()
            self._paused = True
            self._wake.set()
            try:
                await asyncio.sleep(self.cost.load_s() * scale)
                self.version = version
                self._blocks.clear()
                for request in self._running:
                    request.switches.append((request.produced(), version))
                    request.prefill += request.context
                    request.context = 0.0
                for request in self._waiting:
                    request.switches.append((0, version))
            finally:
                self._paused = False
                self._wake.set()
            return time.perf_counter() - started

    def _sample(self, max_tokens: int, allowed: list[int] | None, ignore_eos: bool) -> list[int]:
        eos = self.tokenizer.eos_token_id
        choices = allowed or list(range(self.tokenizer.vocab_size))
        tokens: list[int] = []
        while len(tokens) < max_tokens:
            tokens.append(self.rng.choice(choices))
            if tokens[-1] == eos and not ignore_eos:
                break
        return tokens

    def _cached_prefix(self, ids: list[int]) -> int:
        cached, chain = 0, 0
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            chain = hash((chain, *ids[start:start + BLOCK]))
            if chain not in self._blocks:
                break
            self._blocks.move_to_end(chain)
            cached += BLOCK
        return cached

    def _remember(self, ids: list[int]) -> None:
        chain = 0
        for start in range(0, len(ids) - BLOCK + 1, BLOCK):
            chain = hash((chain, *ids[start:start + BLOCK]))
            self._blocks[chain] = None
            self._blocks.move_to_end(chain)
        while len(self._blocks) > CACHED_BLOCKS:
            self._blocks.popitem(last=False)

    async def _run(self) -> None:
        """Advance the running set to its next event (a request changing phase or ending), or
        less when a request arrives or an update suspends the engine meanwhile."""
        chunk = self.simulation.prefill_chunk
        time_scale = self.simulation.time_scale
        loop = asyncio.get_running_loop()
        while True:
            room = self.config.max_num_seqs - len(self._running)
            self._running += self._waiting[:room]
            del self._waiting[:room]
            if self._paused or not self._running:
                self._wake.clear()
                await self._wake.wait()
                continue
            prefilling = [r for r in self._running if r.prefill > EPS]
            tokens = (sum(min(r.prefill, chunk) for r in prefilling)
                      + len(self._running) - len(prefilling))
            step = self.cost.step_s(tokens, sum(r.context for r in self._running)) * time_scale
            steps = min(r.steps_in_phase(chunk) for r in self._running)
            self._wake.clear()
            async with self.device.held(self._wake):
                if self.device.waiting:  # shared: give the device back after a quantum
                    steps = min(steps, max(1, math.floor(
                        Device.QUANTUM_S * time_scale / step))) if step > 0 else steps
                started = loop.time()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=steps * step)
                elapsed = loop.time() - started
            self.busy_s += elapsed
            done = min(steps, elapsed / step) if step > 0 else steps
            for request in list(self._running):
                if request.prefill > EPS:
                    request.prefill_s += elapsed * min(request.prefill, chunk) / tokens
                    took = min(request.prefill, chunk * done)
                    request.prefill -= took
                else:
                    request.decode_s += elapsed / tokens
                    took = min(request.decode, done)
                    request.decode -= took
                request.context += took
                if request.prefill <= EPS and request.decode <= EPS:
                    self._running.remove(request)
                    if not request.done.done():
                        request.done.set_result(None)
