"""Where the policy comes from: any Hugging Face causal-LM directory, or the tiny default made here.

Nothing is downloaded. The default is a ~0.3M-parameter Qwen3 with a word-level tokenizer over
the built-in domains' words (FrozenLake's, digits, + and =), created once per machine under
~/.cache/rollart/models.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rollart.envs.arithmetic import DIGITS, SYMBOLS
from rollart.envs.frozenlake import ACTIONS, OBSERVATION_WORDS

TINY_MODEL_NAME = "tiny-qwen3-frozenlake-v2"
SPECIAL_TOKENS = ["<pad>", "<unk>", "<eos>"]


def default_model_dir() -> Path:
    root = Path(os.environ.get("ROLLART_CACHE", Path.home() / ".cache" / "rollart"))
    return root / "models" / TINY_MODEL_NAME


def resolve_model_path(path: str | None, seed: int = 0) -> str:
    """The model directory to load: the configured one (checked), or the tiny default."""
    if path is None:
        return str(ensure_tiny_model(default_model_dir(), seed))
    model_dir = Path(path).expanduser()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: {model_dir} is not a Hugging Face model directory (no config.json)"
        )
    return str(model_dir)


def ensure_tiny_model(target: Path, seed: int = 0, hidden_size: int = 128,
                      layers: int = 2) -> Path:
    """The word-level Qwen3 at `target`, made once (benchmarks ask for wider, deeper ones)."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        _write_tiny_model(staging, seed, hidden_size, layers)
        try:
            staging.rename(target)
        except OSError:  # another process made it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_tiny_model(out: Path, seed: int, hidden_size: int, layers: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    words = SPECIAL_TOKENS + ACTIONS + OBSERVATION_WORDS + DIGITS + SYMBOLS
    vocab = {word: i for i, word in enumerate(dict.fromkeys(words))}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with single spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(out)

    config = Qwen3Config(
        vocab_size=32,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=max(hidden_size // 64, 1),
        head_dim=32,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        pad_token_id=vocab["<pad>"],
        eos_token_id=vocab["<eos>"],
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(out)
