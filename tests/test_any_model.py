"""The policy can be any Hugging Face causal-LM directory, not only the tiny default."""

from __future__ import annotations

import copy
import shutil

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rollart.config import AlgorithmConfig, EngineConfig
from rollart.contracts import TrainSample
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore, TurnRecord
from rollart.weights.transfer import pack


def test_a_directory_without_config_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.path"):
        resolve_model_path(str(tmp_path))


@pytest.mark.asyncio(loop_scope="session")
async def test_llama_with_untied_head_samples_trains_and_reloads(model_path, tmp_path):
    llama_dir = tmp_path / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(
        vocab_size=32, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False, pad_token_id=0, eos_token_id=2, bos_token_id=None,
    )).save_pretrained(llama_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(f"{model_path}/{name}", llama_dir / name)
    path = resolve_model_path(str(llama_dir))

    engine = await PolicyEngine(path, EngineConfig(max_num_seqs=16)).start()
    try:
        store = TrajectoryStore(str(tmp_path / "store"))
        allowed = engine.single_token_ids(ACTIONS)
        samples = []
        for member in range(4):
            tid = f"t{member}"
            obs = engine.encode("P F F F | F H F H | F F F H | H F F G")
            sample = await engine.generate(obs, max_tokens=1, temperature=1.0,
                                           allowed_token_ids=allowed)
            store.write_turn(tid, TurnRecord(turn=0, observation_ids=obs,
                                             sampled_ids=sample.token_ids,
                                             logprobs=sample.logprobs, versions=[0],
                                             allowed_ids=allowed))
            samples.append(TrainSample(trajectory_id=tid, group_id="g", reward=float(member % 2)))

        trainer = Trainer(path, learning_rate=1e-2)
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1)
        result = trainer.train_step(store, samples, algorithm, temperature=1.0)
        assert result.version == 1 and result.logprob_mismatch < 1e-4
        version_one = copy.deepcopy(trainer.model)

        await engine.update_weights(result.version, [blob for blob, _ in pack(
            trainer.named_weights(), bucket_bytes=2**16)])
        # after the reload the engine is the trainer's policy again: no mismatch
        again = trainer.train_step(store, samples, algorithm, temperature=1.0)
        assert again.logprob_mismatch > 0  # behaviour logprobs are from version 0 ...
        resampled = await engine.generate(obs, max_tokens=1, temperature=1.0,
                                          allowed_token_ids=allowed)
        with torch.no_grad():
            logits = version_one(torch.tensor([obs])).logits[0, -1]
        masked = torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        expected = torch.log_softmax(masked, -1)[resampled.token_ids[0]].item()
        assert resampled.logprobs[0] == pytest.approx(expected, abs=1e-4)  # ... v1 in the engine
    finally:
        engine.shutdown()
