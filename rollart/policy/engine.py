"""The inference side of the policy: one vLLM `AsyncLLM` per generation replica.

Token-in/token-out: callers pass token ids and get back the sampled ids with the logprob of each
under the distribution that actually sampled it (vLLM's `processed_logprobs`: after the
allowed-token mask and temperature), which is what the trainer's importance ratio needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from rollart.config import EngineConfig, SpeculationConfig
from rollart.policy.speculation_gate import SpeculationGate
from rollart.policy.vllm_plugin import PARENT_ENV, forked_children_exit_with_this_process


@dataclass
class Sample:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    cached_tokens: int
    versions: list[int]
    """The policy version that sampled each token: a request in flight across a weight update
    keeps its earlier tokens and continues under the new version."""
    prefill_s: float = 0.0
    """Engine seconds this request's prefill used: its share of the time it shared the engine
    with others (a request waiting or decoding beside nine others is charged a tenth), so the
    shares of all requests add up to the engine's busy time, whatever the load."""
    decode_s: float = 0.0
    """Engine seconds its decoding used, shared the same way."""

    @property
    def version(self) -> int:
        return self.versions[-1] if self.versions else -1


@dataclass
class _InFlight:
    produced: int = 0
    switches: list[tuple[int, int]] = field(default_factory=list)  # (token index, new version)


START_METHOD = "VLLM_WORKER_MULTIPROC_METHOD"
CPU_BINDING = "VLLM_CPU_OMP_THREADS_BIND"


def cpu_thread_binding(ranks: int, cpus: list[int]) -> str:
    """vLLM's per-rank core lists (`0,1|2,3`): the cores split evenly, ranks sharing cores when
    there are fewer cores than ranks. Its own default binds each rank to a NUMA node of its
    own and refuses to start a tensor-parallel engine on a one-node machine."""
    per_rank = max(1, len(cpus) // ranks)
    groups = [cpus[r * per_rank:(r + 1) * per_rank] if len(cpus) >= ranks
              else [cpus[r % len(cpus)]] for r in range(ranks)]
    return "|".join(",".join(map(str, group)) for group in groups)


@contextlib.contextmanager
def _queue_readers_wait_idle() -> Iterator[None]:
    """The ranks of a tensor-parallel engine read their work from shared-memory queues whose
    readers spin for a second after every message before they wait on a socket; on CPU those
    spinning readers take the cores the ranks compute on (measured on 2 cores: 250 ms of CPU per
    turn per rank). Processes forked meanwhile wait on the socket at once."""
    import inspect

    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    defaults = SpinCondition.__init__.__defaults__
    with_defaults = [name for name, p in inspect.signature(SpinCondition).parameters.items()
                     if p.default is not inspect.Parameter.empty]
    if with_defaults != ["busy_loop_s"]:  # a vLLM whose queue this does not know
        yield
        return
    SpinCondition.__init__.__defaults__ = (0.0,)
    try:
        yield
    finally:
        SpinCondition.__init__.__defaults__ = defaults


@contextlib.contextmanager
def _engine_core_environment(tensor_parallel_size: int) -> Iterator[None]:
    """While the engine core starts: one model runs in the engine core's process ("uni"),
    which vLLM's CPU platform allows only with multiprocessing off (AsyncLLM still runs the
    engine core apart from this process); otherwise it forces a separate worker process, whose
    shared-memory queue busy-loops after every message and whose start costs ~15 s. One OpenMP
    thread, as that worker was bound to one core. A tensor-parallel engine needs its worker
    processes ("mp"), and on CPU each rank bound to cores of its own. Restored after, so
    processes this one starts later do not inherit them. The engine core learns its parent's
    pid, to exit when this process dies (rollart.policy.vllm_plugin); the start method vLLM
    sets is restored too. Garbage is collected first: a forked child would free what it
    inherited, and a dead gloo process group's destructor joins threads that did not come
    along (the child crashed or hung)."""
    import torch
    from vllm.platforms import current_platform

    readers = contextlib.nullcontext()
    values = {"OMP_NUM_THREADS": "1", PARENT_ENV: str(os.getpid())}
    if tensor_parallel_size == 1:
        values["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    elif current_platform.is_cpu():
        if CPU_BINDING not in os.environ:
            values[CPU_BINDING] = cpu_thread_binding(tensor_parallel_size,
                                                     sorted(os.sched_getaffinity(0)))
        readers = _queue_readers_wait_idle()

    before = {name: os.environ.get(name) for name in [*values, START_METHOD]}
    threads = torch.get_num_threads()
    gc.collect()
    os.environ.update(values)
    torch.set_num_threads(1)  # a forked engine core keeps this; OMP_NUM_THREADS came too late
    try:
        with readers, forked_children_exit_with_this_process():
            yield
    finally:
        torch.set_num_threads(threads)
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class PolicyEngine:
    def __init__(self, model_path: str, config: EngineConfig, seed: int = 0,
                 speculation: SpeculationConfig | None = None,
                 tensor_parallel_size: int = 1) -> None:
        self.model_path = model_path
        self.config = config
        self.tensor_parallel_size = tensor_parallel_size
        self.seed = seed
        self.speculation = speculation
        self.speculating = speculation is not None
        self.gate = SpeculationGate(speculation.max_running_requests if speculation else None)
        self._switching: asyncio.Task | None = None
        self.switch_s = 0.0  # seconds spent in speculation switches, all of them
        self.version = 0
        self.llm = None
        self.tokenizer = None
        self._update_lock = asyncio.Lock()
        self._in_flight: dict[str, _InFlight] = {}

    async def start(self) -> PolicyEngine:
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        args = AsyncEngineArgs(
            model=self.model_path,
            dtype=self.config.dtype,
            seed=self.seed,
            max_model_len=self.config.max_model_len,
            max_num_seqs=self.config.max_num_seqs,
            kv_cache_memory_bytes=self.config.kv_cache_mib * 2**20,
            enforce_eager=self.config.enforce_eager,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",
            disable_log_stats=True,
            worker_extension_cls="rollart.policy.vllm_extension.WorkerExtension",
            tensor_parallel_size=self.tensor_parallel_size,
            distributed_executor_backend="uni" if self.tensor_parallel_size == 1 else "mp",
            speculative_config=self.speculation.vllm_config() if self.speculation else None,
        )
        with _engine_core_environment(self.tensor_parallel_size):
            vllm_config = args.create_engine_config()
            os.environ[START_METHOD] = self.config.start_method  # the CPU platform set spawn
            self.llm = AsyncLLM.from_vllm_config(vllm_config, disable_log_stats=True)
        if self.speculation is not None:
            await self.llm.collective_rpc("install_speculation_switch")
            self._adapt_speculation()
        return self

    def shutdown(self) -> None:
        if self.llm is not None:
            self.llm.shutdown()
            self.llm = None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    @property
    def eos_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def single_token_ids(self, words: list[str],
                         field: str = "sampling.constrain_to_actions: action") -> list[int]:
        """The token id of each word; raises, naming `field`, if a word is not one token."""
        ids = []
        for word in words:
            encoded = self.encode(word)
            if len(encoded) != 1:
                raise ValueError(
                    f"{field} {word!r} is {len(encoded)} tokens for this tokenizer; "
                    f"constrained decoding needs single tokens"
                )
            ids.append(encoded[0])
        return ids

    async def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        allowed_token_ids: list[int] | None = None,
        request_id: str | None = None,
        ignore_eos: bool = False,
    ) -> Sample:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            logprobs=0,
            allowed_token_ids=allowed_token_ids,
            ignore_eos=ignore_eos,
            output_kind=RequestOutputKind.CUMULATIVE,
            detokenize=False,
        )
        request_id = request_id or uuid.uuid4().hex
        start_version, progress = self.version, _InFlight()
        self._in_flight[request_id] = progress
        self._adapt_speculation()
        final, since, shares = None, time.monotonic(), [0.0, 0.0]  # prefill, decode
        try:
            async for output in self.llm.generate(
                TokensPrompt(prompt_token_ids=prompt_ids), params, request_id
            ):
                final, now = output, time.monotonic()
                shares[progress.produced > 0] += (now - since) / len(self._in_flight)
                since, produced = now, len(output.outputs[0].token_ids)
                self.gate.emitted(produced - progress.produced, len(self._in_flight),
                                  self.speculating, now)
                progress.produced = produced
                self._adapt_speculation()
        finally:
            del self._in_flight[request_id]
            self._adapt_speculation()
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        logprobs = [step[tok].logprob for step, tok in zip(completion.logprobs, token_ids,
                                                            strict=True)]
        versions = [start_version] * len(token_ids)
        for index, version in progress.switches:
            versions[index:] = [version] * (len(token_ids) - index)
        return Sample(
            token_ids=token_ids,
            logprobs=logprobs,
            finish_reason=completion.finish_reason or "unknown",
            cached_tokens=final.num_cached_tokens or 0,
            versions=versions,
            prefill_s=shares[0],
            decode_s=shares[1],
        )

    async def next_token_distribution(self, prompt_ids: list[int],
                                      token_ids: list[int]) -> list[float]:
        """P(next token = each of `token_ids` | prompt), renormalized over them: a judge's
        verdict as a distribution, so its reward is an expectation rather than one draw."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(temperature=1.0, max_tokens=1, logprobs=len(token_ids),
                                allowed_token_ids=token_ids, detokenize=False,
                                output_kind=RequestOutputKind.FINAL_ONLY)
        final = None
        async for output in self.llm.generate(TokensPrompt(prompt_token_ids=prompt_ids),
                                              params, uuid.uuid4().hex):
            final = output
        step = final.outputs[0].logprobs[0]
        weights = [math.exp(step[t].logprob) if t in step else 0.0 for t in token_ids]
        total = sum(weights)
        return [w / total for w in weights]

    @property
    def running_requests(self) -> int:
        return len(self._in_flight)

    def _adapt_speculation(self) -> None:
        """Speculate while the gate wants it at this engine's load. The switch is one call into
        the engine core (taken between two steps), made in the background and only when the
        side changes."""
        if self.speculation is None or (self._switching is not None
                                        and not self._switching.done()):
            return
        if self.gate.wanted(len(self._in_flight)) != self.speculating:
            self._switching = asyncio.ensure_future(self._switch_speculation())

    async def _switch_speculation(self) -> None:
        while (wanted := self.gate.wanted(len(self._in_flight))) != self.speculating:
            started = time.perf_counter()
            await self.llm.collective_rpc("set_speculation", args=(wanted,))
            self.switch_s += time.perf_counter() - started
            self.speculating = wanted

    async def speculation_counters(self) -> dict[str, int] | None:
        """Draft tokens, accepted tokens, verify steps and switches since the engine started;
        None when it does not speculate."""
        if self.speculation is None:
            return None
        return (await self.llm.collective_rpc("speculation_counters"))[0]

    async def update_weights(self, version: int, buckets: list[bytes]) -> float:
        """Suspend -> load -> resume, with the version's weights already in memory (safetensors
        buckets, pulled while this engine kept generating). Requests in flight keep their tokens
        and recompute their KV under the new weights; returns the seconds generation was
        suspended."""
        async with self._update_lock:
            started = time.perf_counter()
            await self.llm.pause_generation(mode="keep", clear_cache=False)
            try:
                await self.llm.collective_rpc("load_weight_buckets", args=(buckets,))
                await self.llm.collective_rpc("retie_word_embeddings")
                await self.llm.reset_prefix_cache(reset_running_requests=True)
                self.version = version
                for progress in self._in_flight.values():
                    progress.switches.append((progress.produced, version))
            finally:
                await self.llm.resume_generation()
            return time.perf_counter() - started
