"""The trainer on megatron-core's GPT model, its weights converted from and to Hugging Face names
so the generation fleet keeps loading HF checkpoints.

The model is built from the HF config (Qwen3, Qwen2 and Llama layouts: RMSNorm, SwiGLU, RoPE,
grouped-query attention) with megatron-core's local layers, and takes the HF weights: q, k and v
go into one `linear_qkv` interleaved by query group, gate and up into one `linear_fc1`. One rank
(tensor and pipeline parallel size 1); the GRPO step is the torch trainer's. On a machine without
CUDA, megatron-core's local layers still ask for the current CUDA device (buffers, RoPE) and a
CUDA RNG state (dropout): `_CpuStandIns` points those at the CPU so the backend is checked
here.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F

from rollart.policy.trainer import Trainer

LAYOUTS = ("qwen3", "qwen2", "llama")


def megatron_config(hf_config):
    """megatron-core's TransformerConfig for an HF causal-LM config of a supported layout."""
    from megatron.core.transformer import TransformerConfig

    if hf_config.model_type not in LAYOUTS:
        raise ValueError(f"trainer.backend megatron: model type {hf_config.model_type!r} has no "
                         f"conversion (supported: {', '.join(LAYOUTS)})")
    heads = hf_config.num_attention_heads
    return TransformerConfig(
        num_layers=hf_config.num_hidden_layers, hidden_size=hf_config.hidden_size,
        num_attention_heads=heads, num_query_groups=hf_config.num_key_value_heads,
        kv_channels=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads,
        ffn_hidden_size=hf_config.intermediate_size, normalization="RMSNorm",
        layernorm_epsilon=hf_config.rms_norm_eps, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2",
        qk_layernorm=hf_config.model_type == "qwen3", hidden_dropout=0.0,
        attention_dropout=0.0, use_cpu_initialization=True, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, bias_activation_fusion=False,
        gradient_accumulation_fusion=False, persist_layer_norm=False,
        params_dtype=torch.float32)


def _rope_theta(hf_config) -> float:
    parameters = getattr(hf_config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(hf_config, "rope_theta", 10000.0)))


class _Layout:
    """How one HF config's attention splits into query groups."""

    def __init__(self, hf_config) -> None:
        self.groups = hf_config.num_key_value_heads
        heads = hf_config.num_attention_heads
        self.head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
        self.per_group = heads // self.groups
        self.layers = hf_config.num_hidden_layers
        self.tied = hf_config.tie_word_embeddings

    def qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Rows of q, k and v (weights, or biases) interleaved by query group."""
        shape = q.shape[1:]
        parts = [q.reshape(self.groups, self.per_group * self.head_dim, *shape),
                 k.reshape(self.groups, self.head_dim, *shape),
                 v.reshape(self.groups, self.head_dim, *shape)]
        return torch.cat(parts, dim=1).reshape(-1, *shape)

    def split_qkv(self, fused: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shape = fused.shape[1:]
        grouped = fused.reshape(self.groups, (self.per_group + 2) * self.head_dim, *shape)
        q, k, v = grouped.split([self.per_group * self.head_dim, self.head_dim,
                                 self.head_dim], dim=1)
        return tuple(t.reshape(-1, *shape) for t in (q, k, v))


_ONE_TO_ONE = {  # HF name in a layer -> megatron-core name in a layer
    "input_layernorm.weight": "input_layernorm.weight",
    "self_attn.q_norm.weight": "self_attention.q_layernorm.weight",
    "self_attn.k_norm.weight": "self_attention.k_layernorm.weight",
    "self_attn.o_proj.weight": "self_attention.linear_proj.weight",
    "post_attention_layernorm.weight": "pre_mlp_layernorm.weight",
    "mlp.down_proj.weight": "mlp.linear_fc2.weight",
}


def to_megatron(hf: dict[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    """HF weights by megatron-core name."""
    layout = _Layout(hf_config)
    out = {"embedding.word_embeddings.weight": hf["model.embed_tokens.weight"],
           "decoder.final_layernorm.weight": hf["model.norm.weight"]}
    if not layout.tied:
        out["output_layer.weight"] = hf["lm_head.weight"]
    for i in range(layout.layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for name, target in _ONE_TO_ONE.items():
            if src + name in hf:
                out[dst + target] = hf[src + name]
        for kind in ("weight", "bias"):
            if src + f"self_attn.q_proj.{kind}" in hf:
                out[dst + f"self_attention.linear_qkv.{kind}"] = layout.qkv(
                    *(hf[src + f"self_attn.{p}_proj.{kind}"] for p in "qkv"))
        out[dst + "mlp.linear_fc1.weight"] = torch.cat(
            [hf[src + "mlp.gate_proj.weight"], hf[src + "mlp.up_proj.weight"]])
    return out


def to_hf(megatron: dict[str, torch.Tensor], hf_config) -> dict[str, torch.Tensor]:
    """megatron-core weights by HF name (a tied lm_head appears once, as the embeddings)."""
    layout = _Layout(hf_config)
    out = {"model.embed_tokens.weight": megatron["embedding.word_embeddings.weight"],
           "model.norm.weight": megatron["decoder.final_layernorm.weight"]}
    if not layout.tied:
        out["lm_head.weight"] = megatron["output_layer.weight"]
    for i in range(layout.layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for name, target in _ONE_TO_ONE.items():
            if src + target in megatron:
                out[dst + name] = megatron[src + target]
        for kind in ("weight", "bias"):
            if src + f"self_attention.linear_qkv.{kind}" in megatron:
                q, k, v = layout.split_qkv(megatron[src + f"self_attention.linear_qkv.{kind}"])
                for part, tensor in zip("qkv", (q, k, v), strict=True):
                    out[dst + f"self_attn.{part}_proj.{kind}"] = tensor
        gate, up = megatron[src + "mlp.linear_fc1.weight"].chunk(2)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = gate, up
    return out


class MegatronTrainer(Trainer):
    def _place_model(self) -> None:
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

        hf = self.model
        self.hf_config = hf.config
        config = megatron_config(hf.config)
        _join_model_parallel(self.device)
        self.model = GPTModel(
            config, get_gpt_layer_local_spec(qk_layernorm=config.qk_layernorm,
                                             normalization="RMSNorm"),
            vocab_size=hf.config.vocab_size,
            max_sequence_length=hf.config.max_position_embeddings,
            share_embeddings_and_output_weights=hf.config.tie_word_embeddings,
            position_embedding_type="rope", rotary_base=_rope_theta(hf.config))
        weights = to_megatron(dict(hf.named_parameters()), hf.config)
        self.model.load_state_dict(
            {name: tensor.detach() for name, tensor in weights.items()}, strict=False)
        _check_loaded(self.model, weights)
        self.model.to(self.device).train()

    def close(self) -> None:
        """Leave megatron-core's groups and the process group, and undo the CPU stand-ins,
        so that another trainer can start in this process."""
        import torch.distributed as dist
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()
        _CPU_STAND_INS.undo()

    def logits(self, ids: torch.Tensor, attention: torch.Tensor | None = None) -> torch.Tensor:
        rows, length = ids.shape
        positions = torch.arange(length, device=ids.device).expand(rows, length)
        # True where a position may not look: its future. Padding sits after every real token,
        # so the causal mask alone keeps it out.
        future = torch.triu(torch.ones(length, length, dtype=torch.bool, device=ids.device), 1)
        return self.model(ids, positions, future.expand(rows, 1, length, length))

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        own = {name: p.detach().to("cpu") for name, p in self.model.named_parameters()}
        yield from to_hf(own, self.hf_config).items()

    def load_weights(self, tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        named = dict(tensors)
        expected = dict(self.named_weights())
        missing = [name for name in expected if name not in named]
        if missing:
            raise KeyError(f"weights of version {version} lack {missing[0]}")
        converted = to_megatron(named, self.hf_config)
        with torch.no_grad():
            for name, parameter in self.model.named_parameters():
                parameter.copy_(converted[name])
        self.version = version


def _check_loaded(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
    names = {name for name, _ in model.named_parameters()}
    if names != set(weights):
        raise ValueError(f"megatron conversion: the model's weights {sorted(names - set(weights))}"
                         f" were not converted, {sorted(set(weights) - names)} have no place")


def _join_model_parallel(device: torch.device) -> None:
    """One rank of tensor and pipeline parallel size 1 (megatron-core needs its groups)."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if device.type == "cpu" and not torch.cuda.is_available():
        _CPU_STAND_INS.install()
    if not dist.is_initialized():
        rendezvous = Path(tempfile.mkdtemp(prefix="rollart-megatron-")) / "store"
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"file://{rendezvous}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


class _CpuStandIns:
    """megatron-core's local layers on a machine without CUDA: buffers and RoPE tables go to
    the CPU, and the dropout RNG fork (dropout is off in this backend's configs) does nothing."""

    def __init__(self) -> None:
        self.saved: tuple | None = None

    def install(self) -> None:
        from megatron.core.tensor_parallel import random as megatron_random

        if self.saved is not None:
            return

        class CpuRngTracker(megatron_random.CudaRNGStatesTracker):
            def add(self, name: str, seed: int) -> None:
                self.states_[name] = None

            @contextlib.contextmanager
            def fork(self, name: str = "model-parallel-rng") -> Iterator[None]:
                yield

        self.saved = (torch.cuda.current_device, megatron_random._CUDA_RNG_STATE_TRACKER,
                      megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED)
        torch.cuda.current_device = lambda: "cpu"
        megatron_random._CUDA_RNG_STATE_TRACKER = CpuRngTracker()
        megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED = True

    def undo(self) -> None:
        from megatron.core.tensor_parallel import random as megatron_random

        if self.saved is None:
            return
        (torch.cuda.current_device, megatron_random._CUDA_RNG_STATE_TRACKER,
         megatron_random._CUDA_RNG_STATE_TRACKER_INITIALIZED) = self.saved
        self.saved = None


_CPU_STAND_INS = _CpuStandIns()
