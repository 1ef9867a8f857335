"""The FSDP2 trainer on two ranks (gloo, this machine's CPU) against the single-process one: the
same steps, the same weights, checkpoints either can resume, and a clear error when a rank
dies."""

import os
import random
import signal

import pytest
import torch

from rollart.blobs import LocalBlobs
from rollart.config import AlgorithmConfig
from rollart.contracts import TrainSample
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.sharded import RankFailed, ShardedTrainer
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore, TurnRecord


@pytest.fixture(scope="module")
def sharded(model_path):
    """One two-rank trainer for the module (a process holds one process group at a time);
    made again after a test kills a rank."""
    held: list[ShardedTrainer] = []

    def get() -> ShardedTrainer:
        if held and all(f.is_alive() for f in held[0].followers):
            held[0].reset()
            return held[0]
        if held:
            held.pop().close()
        held.append(ShardedTrainer(model_path, learning_rate=1e-2, threads=1, ranks=2))
        return held[0]

    yield get
    if held:
        held[0].close()


def stored_batch(trainer: Trainer, store: TrajectoryStore, groups: int = 3,
                 size: int = 4) -> list[TrainSample]:
    """Multi-turn trajectories of unequal lengths, some constrained to the actions, their
    behaviour logprobs a little off the trainer's (so the off-policy weights vary)."""
    rng = random.Random(7)
    vocab = trainer.vocab_size
    actions = trainer.tokenizer.convert_tokens_to_ids(ACTIONS)
    samples = []
    for g in range(groups):
        for k in range(size):
            tid = f"g{g}.t{k}"
            turns = rng.randint(1, 3)
            for turn in range(turns):
                sampled = [rng.choice(actions) for _ in range(rng.randint(1, 3))]
                store.write_turn(tid, TurnRecord(
                    turn=turn, observation_ids=[rng.randrange(3, vocab) for _ in
                                                range(rng.randint(2, 6))],
                    sampled_ids=sampled, logprobs=[-1.4 + rng.uniform(-0.2, 0.2)
                                                   for _ in sampled],
                    versions=[0] * len(sampled),
                    allowed_ids=actions if (g + k) % 2 else None))
            samples.append(TrainSample(trajectory_id=tid, group_id=f"g{g}",
                                       reward=float(rng.random() < 0.5), turns=turns))
    return samples


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_two_ranks_take_the_single_process_step(sharded, model_path, tmp_path, aggregation):
    single = Trainer(model_path, learning_rate=1e-2, threads=1)
    ranks = sharded()
    store = TrajectoryStore(str(tmp_path))
    samples = stored_batch(single, store)
    algorithm = AlgorithmConfig(group_size=4, batch_size=12, minibatches=3, epochs=2,
                                loss_aggregation=aggregation, entropy_coef=0.01)
    for _ in range(2):
        one = single.train_step(store, samples, algorithm, temperature=1.0)
        two = ranks.train_step(store, samples, algorithm, temperature=1.0)
        assert two.version == one.version
        assert two.loss == pytest.approx(one.loss, rel=1e-4, abs=1e-6)
        assert two.grad_norm == pytest.approx(one.grad_norm, rel=1e-4)
        assert two.clip_fraction == pytest.approx(one.clip_fraction, abs=1e-6)
        assert two.trained_tokens == one.trained_tokens
        assert two.learning.step_kl == pytest.approx(one.learning.step_kl, rel=1e-3, abs=1e-9)
    assert one.grad_norm > 0
    weights = dict(ranks.named_weights())
    for name, parameter in single.named_weights():
        assert weights[name].shape == parameter.shape
        torch.testing.assert_close(weights[name], parameter, rtol=1e-4, atol=1e-5, msg=name)
    moved = dict(Trainer(model_path, learning_rate=1e-2).named_weights())
    assert any(not torch.equal(moved[n], w) for n, w in weights.items())


def test_each_rank_holds_half_of_the_weights_and_optimizer(sharded):
    ranks = sharded()
    whole = sum(p.numel() for p in ranks.model.parameters())
    local = sum(p.to_local().numel() for p in ranks.model.parameters())
    assert local < 0.6 * whole


def test_checkpoints_move_between_rank_counts(sharded, model_path, tmp_path):
    store = TrajectoryStore(str(tmp_path / "store"))
    blobs = LocalBlobs(tmp_path / "checkpoints")
    algorithm = AlgorithmConfig(group_size=4, batch_size=8, minibatches=1, epochs=1)
    ranks = sharded()
    samples = stored_batch(ranks, store, groups=2)
    ranks.train_step(store, samples, algorithm, temperature=1.0)
    ranks.save_checkpoint(blobs, "two")

    single = Trainer(model_path, learning_rate=1e-2, threads=1)
    assert single.load_checkpoint(blobs, "two") == 1
    for name, weight in ranks.named_weights():
        assert torch.equal(dict(single.named_weights())[name], weight), name
    one_more = single.train_step(store, samples, algorithm, temperature=1.0)
    single.save_checkpoint(blobs, "one")

    ranks.reset()
    assert ranks.load_checkpoint(blobs, "one") == 2
    for name, weight in single.named_weights():
        assert torch.equal(dict(ranks.named_weights())[name], weight), name
    # the optimizer's moments came back too: the next steps agree
    after_single = single.train_step(store, samples, algorithm, temperature=1.0)
    after_ranks = ranks.train_step(store, samples, algorithm, temperature=1.0)
    assert after_ranks.grad_norm == pytest.approx(after_single.grad_norm, rel=1e-4)
    assert one_more.version == 2 and after_ranks.version == 3
    for name, weight in single.named_weights():
        torch.testing.assert_close(dict(ranks.named_weights())[name], weight, rtol=1e-4,
                                   atol=1e-5, msg=name)


def test_weights_taken_from_the_store_reach_every_rank(sharded, model_path):
    ranks = sharded()
    halved = {n: w * 0.5 for n, w in Trainer(model_path, learning_rate=1e-2).named_weights()}
    ranks.load_weights(halved.items(), version=4)
    assert ranks.version == 4
    for name, weight in ranks.named_weights():
        assert torch.equal(weight, halved[name]), name
    with pytest.raises(KeyError, match="lack"):
        ranks.load_weights(list(halved.items())[1:], version=5)
    assert dict(ranks.named_weights()).keys() == halved.keys()  # still in step


def test_a_rank_that_dies_is_named(sharded, tmp_path):
    ranks = sharded()
    follower = ranks.followers[0]
    os.kill(follower.pid, signal.SIGKILL)
    follower.join(timeout=10)
    with pytest.raises(RankFailed, match=r"trainer rank 1 is gone \(exit code -9\)"):
        ranks.named_weights()


def test_one_rank_is_not_sharded(model_path):
    with pytest.raises(ValueError, match="2 ranks or more"):
        ShardedTrainer(model_path, learning_rate=1e-2, ranks=1)
