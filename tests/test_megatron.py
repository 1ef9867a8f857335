"""The megatron-core backend against the Hugging Face model it converts: the same logits, the
same GRPO step, weights that go back to HF names exactly, for each supported layout."""

import pytest
import torch
from test_sharded_trainer import stored_batch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from rollart.blobs import LocalBlobs
from rollart.config import AlgorithmConfig
from rollart.policy.megatron import MegatronTrainer, to_hf, to_megatron
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore

SHAPE = {"vocab_size": 64, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128}


@pytest.fixture
def megatron():
    """Trainers made by a test, closed after it (a process holds one process group)."""
    made: list[MegatronTrainer] = []

    def make(path: str) -> MegatronTrainer:
        made.append(MegatronTrainer(path, learning_rate=1e-2, threads=1))
        return made[-1]

    yield make
    for trainer in made:
        trainer.close()


def other_layout(kind: str, out) -> str:
    """A small random model of another supported layout: Qwen2 (q, k, v biases, its own
    lm_head) or Llama; the tiny default's tokenizer beside it."""
    from transformers import AutoTokenizer

    from rollart.policy.model import resolve_model_path

    torch.manual_seed(1)
    if kind == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=False))
    else:
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True))
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(resolve_model_path(None)).save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("layout", ["qwen3", "qwen2", "llama"])
def test_megatron_computes_the_hf_models_logits(megatron, model_path, tmp_path, layout):
    path = model_path if layout == "qwen3" else other_layout(layout, tmp_path / layout)
    reference = Trainer(path, learning_rate=1e-2, threads=1)
    trainer = megatron(path)
    assert type(trainer.model).__name__ == "GPTModel"
    hf, ours = dict(reference.named_weights()), dict(trainer.named_weights())
    assert ours.keys() == hf.keys()
    for name, weight in hf.items():
        assert torch.equal(ours[name], weight), name
    ids = torch.randint(0, 30, (3, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(trainer.logits(ids), reference.logits(ids), rtol=1e-4,
                                   atol=1e-5)


def test_conversion_goes_both_ways_exactly(model_path):
    config = Qwen2Config(**SHAPE, tie_word_embeddings=False)
    hf = {n: p.detach() for n, p in Qwen2ForCausalLM(config).named_parameters()}
    back = to_hf(to_megatron(hf, config), config)
    assert back.keys() == hf.keys()
    for name, weight in hf.items():
        assert torch.equal(back[name], weight), name


def test_megatron_takes_the_torch_trainers_step(megatron, model_path, tmp_path):
    reference = Trainer(model_path, learning_rate=1e-2, threads=1)
    trainer = megatron(model_path)
    store = TrajectoryStore(str(tmp_path))
    samples = stored_batch(reference, store)
    algorithm = AlgorithmConfig(group_size=4, batch_size=12, minibatches=3, epochs=2)
    for _ in range(2):
        one = reference.train_step(store, samples, algorithm, temperature=1.0)
        two = trainer.train_step(store, samples, algorithm, temperature=1.0)
        assert two.loss == pytest.approx(one.loss, rel=1e-3, abs=1e-6)
        assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-3)
    assert one.grad_norm > 0
    ours = dict(trainer.named_weights())
    for name, weight in reference.named_weights():
        torch.testing.assert_close(ours[name], weight, rtol=1e-4, atol=1e-5, msg=name)

    blobs = LocalBlobs(tmp_path / "checkpoints")
    trainer.save_checkpoint(blobs, "mcore")
    trainer.reset()
    assert trainer.load_checkpoint(blobs, "mcore") == 2
    for name, weight in trainer.named_weights():
        assert torch.equal(weight, ours[name]), name
    with pytest.raises(KeyError, match="lack"):
        trainer.load_weights(list(ours.items())[1:], version=3)


def test_an_unconverted_layout_is_named(megatron, tmp_path):
    from transformers import AutoTokenizer

    from rollart.policy.model import resolve_model_path

    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)).save_pretrained(
        tmp_path)
    AutoTokenizer.from_pretrained(resolve_model_path(None)).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="model type 'gpt2' has no conversion"):
        megatron(str(tmp_path))


@pytest.mark.timeout(120)
@pytest.mark.asyncio(loop_scope="session")
async def test_an_engine_forked_after_a_trainer_closed_starts(model_path):
    """A closed trainer's gloo process group can wait for the cycle collector; an engine core
    forked meanwhile collected it and its destructor joined threads that had stayed behind: the
    engine core crashed or hung at start (seen in CI, after the megatron end-to-end run)."""
    import gc

    from rollart.config import EngineConfig
    from rollart.policy.engine import PolicyEngine

    gc.disable()  # the trainer stays uncollected garbage until the engine has started
    try:
        trainer = MegatronTrainer(model_path, learning_rate=1e-2, threads=1)
        trainer.close()
        trainer.cycle = trainer  # as a worker's activities and closers hold theirs
        del trainer
        engine = await PolicyEngine(model_path, EngineConfig()).start()
    finally:
        gc.enable()
    try:
        ids = engine.encode("P F F F")
        result = await engine.generate(ids, max_tokens=2, temperature=0.0, ignore_eos=True)
        assert len(result.token_ids) == 2
    finally:
        engine.shutdown()
