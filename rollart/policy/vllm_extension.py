"""Code that runs inside vLLM's worker process (loaded through `worker_extension_cls`).

On CPU, vLLM repacks each linear layer's weight into a oneDNN/sgl kernel format at load time and
drops the original tensor; its in-place `reload_weights` then leaves the packed copies stale, so the
engine would keep sampling from the first version (measured: logprobs off by up to 5 nats after one
update). Importing this module in the worker keeps plain `F.linear` over the live weight tensors,
so an in-place reload takes effect. GPU builds do not take this path.

It also holds the run-time switch of speculative decoding: vLLM has none (its suffix proposer
asserts one fixed draft length), so `install_speculation_switch` wraps the engine's proposer in
place. Off, the sampled tokens still go into the suffix trees (they stay current) but nothing is
drafted, so the scheduler schedules no draft and each step is a plain decode step.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _dispatch_keeping_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)


def _expand_batch_to_tokens(x: torch.Tensor, cu_num_tokens: torch.Tensor, num_tokens: int,
                            replace_from: int = 0, replace_to: int = 0) -> torch.Tensor:
    """Each request's value repeated over its draft positions. vLLM's version is a Triton
    kernel that does not run on a CPU build, which leaves its output uninitialized: the
    rejection sampler then divided the target logits by garbage temperatures (measured: sampled
    tokens' frequencies far from the model's at temperature 1, chi-square p < 1e-100)."""
    counts = torch.diff(cu_num_tokens, prepend=cu_num_tokens.new_zeros(1))
    expanded = x.repeat_interleave(counts.long(), output_size=num_tokens)
    if replace_from != replace_to:
        expanded = torch.where(expanded == replace_from, replace_to, expanded).to(x.dtype)
    return expanded


def _install() -> None:
    from vllm.model_executor.layers import linear, utils, vocab_parallel_embedding
    from vllm.platforms import current_platform
    from vllm.v1.sample import rejection_sampler

    if current_platform.is_cpu():
        rejection_sampler.expand_batch_to_tokens = _expand_batch_to_tokens

    for module in (utils, linear, vocab_parallel_embedding):
        if hasattr(module, "dispatch_cpu_unquantized_gemm"):
            module.dispatch_cpu_unquantized_gemm = _dispatch_keeping_weights


_install()


class WeightSyncExtension:
    def load_weight_buckets(self, buckets: list[bytes]) -> int:
        """Reload every tensor in these safetensors blobs in place (checkpoint names, as the
        trainer's model names them); returns how many were loaded."""
        from safetensors.torch import load

        loaded = 0

        def tensors():
            nonlocal loaded
            for blob in buckets:
                for item in load(blob).items():
                    loaded += 1
                    yield item

        self.model_runner.reload_weights(weights_iterator=tensors())
        return loaded

    def retie_word_embeddings(self) -> bool:
        """A checkpoint of a model with tied embeddings has no lm_head tensor, and vLLM's reload
        puts the old head back; copy the fresh embeddings into it."""
        model = self.model_runner.model
        config = getattr(model, "config", None)
        if not getattr(config, "tie_word_embeddings", False):
            return False
        model.lm_head.weight.data.copy_(model.model.embed_tokens.weight.data)
        return True


class SpeculationSwitch:
    """Wraps the suffix proposer's `propose` (on the instance: vLLM checks the proposer's type).
    On, it proposes as usual; off, it only records the new tokens in the suffix trees (so they
    stay current) and drafts nothing, skipping the tree search. Counts what speculation did:
    tokens drafted, drafts accepted (a verify step emits its accepted drafts plus one token),
    verify steps."""

    def __init__(self, drafter) -> None:
        self.on = True
        self.switches = 0
        self.draft_tokens = self.accepted_tokens = self.verify_steps = 0
        self._drafted: dict[str, int] = {}
        self._drafter = drafter
        self._propose = drafter.propose
        drafter.propose = self.propose

    def propose(self, num_speculative_tokens, input_batch, sampled_token_ids, *args, **kwargs):
        for index, sampled in enumerate(sampled_token_ids):
            drafted = self._drafted.pop(input_batch.req_ids[index], 0)
            if drafted and sampled:
                self.draft_tokens += drafted
                self.accepted_tokens += len(sampled) - 1
                self.verify_steps += 1
        if not self.on:
            self._drafted = {}
            return self._record_only(input_batch, sampled_token_ids)
        drafts = self._propose(num_speculative_tokens, input_batch, sampled_token_ids,
                               *args, **kwargs)
        self._drafted = {input_batch.req_ids[i]: len(d) for i, d in enumerate(drafts) if d}
        return drafts

    def _record_only(self, input_batch, sampled_token_ids) -> list[list[int]]:
        cache = self._drafter.suffix_cache
        for index, sampled in enumerate(sampled_token_ids):
            if not sampled:  # a partial prefill
                continue
            request = input_batch.req_ids[index]
            if request not in cache.active_requests:
                if request in cache.cached_requests:
                    cache.evict_cached_response(request)
                row = input_batch.req_id_to_index[request]
                prompt = input_batch.token_ids_cpu[row, :input_batch.num_prompt_tokens[row]]
                cache.start_request(request, prompt)
            cache.add_active_response(request, sampled)
        for request in cache.active_requests - input_batch.req_id_to_index.keys():
            cache.stop_request(request)
        return [[] for _ in sampled_token_ids]

    def set(self, on: bool) -> None:
        if on != self.on:
            self.on, self.switches = on, self.switches + 1
            self._drafted.clear()

    def counters(self) -> dict[str, int]:
        return {"draft_tokens": self.draft_tokens, "accepted_tokens": self.accepted_tokens,
                "verify_steps": self.verify_steps, "switches": self.switches,
                "on": int(self.on)}


class SpeculationExtension:
    def install_speculation_switch(self) -> bool:
        """Once, after the engine started with a speculative config; False without one."""
        runner = self.model_runner
        if getattr(runner, "speculation_switch", None) is None:
            drafter = getattr(runner, "drafter", None)
            if drafter is None:
                return False
            runner.speculation_switch = SpeculationSwitch(drafter)
        return True

    def set_speculation(self, on: bool) -> None:
        self.model_runner.speculation_switch.set(on)

    def speculation_counters(self) -> dict[str, int]:
        """Counts since the engine started (the caller takes differences)."""
        return self.model_runner.speculation_switch.counters()


class WorkerExtension(WeightSyncExtension, SpeculationExtension):
    """What `worker_extension_cls` names: every method the engine calls in its worker."""
