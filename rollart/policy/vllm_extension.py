"""Code that runs inside vLLM's worker process (loaded through `worker_extension_cls`).

On CPU, vLLM repacks each linear layer's weight into a oneDNN/sgl kernel format at load time and
drops the original tensor; its in-place `reload_weights` then leaves the packed copies stale, so the
engine would keep sampling from the first version (measured: logprobs off by up to 5 nats after one
update). Importing this module in the worker keeps plain `F.linear` over the live weight tensors,
so an in-place reload takes effect. GPU builds do not take this path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _dispatch_keeping_weights(layer: torch.nn.Module, remove_weight: bool) -> None:
    layer.cpu_linear = lambda x, weight, bias: F.linear(x, weight, bias)


def _install() -> None:
    from vllm.model_executor.layers import linear, utils, vocab_parallel_embedding

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
