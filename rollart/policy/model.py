"""Where the policy comes from: any Hugging Face causal-LM directory, or the tiny default made here.

Nothing is downloaded. The default is a ~0.3M-parameter Qwen3 with a word-level tokenizer over
the built-in domains' words (FrozenLake's, digits, + and =), created once per machine under
~/.cache/rollart/models. A run with any other environment gets a sibling whose vocabulary covers
it: the words its env classes declare (`vocabulary`, `action_vocabulary`, `answer_alphabet`) as
whole tokens, and every other word spelled in printable ASCII characters (WordPiece pieces), so
no observation reaches the policy as `<unk>` but characters outside ASCII.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import string
import tempfile
from pathlib import Path

from rollart.config import RunConfig
from rollart.envs.arithmetic import DIGITS, SYMBOLS
from rollart.envs.frozenlake import ACTIONS, OBSERVATION_WORDS

TINY_MODEL_NAME = "tiny-qwen3-frozenlake-v2"
SPECIAL_TOKENS = ["<pad>", "<unk>", "<eos>"]
BUILTIN_WORDS = list(dict.fromkeys(ACTIONS + OBSERVATION_WORDS + DIGITS + SYMBOLS))
CHARACTERS = [c for c in string.printable if not c.isspace()]
PIECE_PREFIX = "##"  # a piece that continues a word (WordPiece's convention)


def default_model_dir() -> Path:
    root = Path(os.environ.get("ROLLART_CACHE", Path.home() / ".cache" / "rollart"))
    return root / "models" / TINY_MODEL_NAME


def policy_model_path(config: RunConfig) -> str:
    """The run's policy: `model.path`, or the tiny default covering its domains' text."""
    if config.model.path is not None:
        return resolve_model_path(config.model.path, config.model.seed)
    extra = domain_words(config)
    if extra is None:
        return resolve_model_path(None, config.model.seed)
    return str(ensure_tiny_model(open_model_dir(extra), config.model.seed, extra_words=extra))


def domain_words(config: RunConfig) -> list[str] | None:
    """The words the configured domains' envs declare beyond the built-in ones, or None when
    the built-in vocabulary covers every domain."""
    from rollart.envs import load_plugins
    from rollart.envs.base import declared_words

    load_plugins(config.plugins)
    declared = [declared_words(domain.env) for domain in config.domains.values()]
    if all(words is not None and set(words) <= set(BUILTIN_WORDS) for words in declared):
        return None
    extra = {word for words in declared for word in words or [] if word not in BUILTIN_WORDS}
    return sorted(extra)


def open_model_dir(extra_words: list[str]) -> Path:
    digest = hashlib.sha256("\n".join(extra_words).encode()).hexdigest()[:12]
    return default_model_dir().with_name(f"tiny-qwen3-open-{digest}")


def resolve_model_path(path: str | None, seed: int = 0) -> str:
    """The model directory to load: the configured one (checked), or the tiny default for the
    built-in domains."""
    if path is None:
        return str(ensure_tiny_model(default_model_dir(), seed))
    model_dir = Path(path).expanduser()
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path: {model_dir} is not a Hugging Face model directory (no config.json)"
        )
    return str(model_dir)


def ensure_tiny_model(target: Path, seed: int = 0, hidden_size: int = 128,
                      layers: int = 2, extra_words: list[str] | None = None) -> Path:
    """The word-level Qwen3 at `target`, made once (benchmarks ask for wider, deeper ones);
    with `extra_words`, an open vocabulary: those words too, and characters for the rest."""
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=".staging-"))
    try:
        _write_tiny_model(staging, seed, hidden_size, layers, extra_words)
        try:
            staging.rename(target)
        except OSError:  # another process made it first
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_tiny_model(out: Path, seed: int, hidden_size: int, layers: int,
                      extra_words: list[str] | None) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    words = SPECIAL_TOKENS + BUILTIN_WORDS
    if extra_words is not None:
        words += extra_words + CHARACTERS + [PIECE_PREFIX + c for c in CHARACTERS]
    vocab = {word: i for i, word in enumerate(dict.fromkeys(words))}
    if extra_words is None:
        model = models.WordLevel(vocab=vocab, unk_token="<unk>")
    else:  # a word not in the vocabulary: its longest known prefix, then the rest's pieces
        model = models.WordPiece(vocab=vocab, unk_token="<unk>",
                                 continuing_subword_prefix=PIECE_PREFIX)
    backend = Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix=PIECE_PREFIX)  # words joined by single spaces
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", unk_token="<unk>", eos_token="<eos>"
    )
    tokenizer.save_pretrained(out)

    config = Qwen3Config(
        vocab_size=max(32, -(-len(vocab) // 32) * 32),
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
