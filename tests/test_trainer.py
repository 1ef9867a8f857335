import math

import pytest
import torch
from temporalio.exceptions import ApplicationError

from rollart.activities.train import TrainActivities
from rollart.blobs import LocalBlobs
from rollart.config import AlgorithmConfig
from rollart.contracts import TrainSample
from rollart.envs.frozenlake import ACTIONS
from rollart.policy.trainer import Trainer, layout
from rollart.store import TrajectoryStore, TurnRecord
from rollart.weights import Publisher, Puller


def test_layout_trains_only_sampled_tokens_in_engine_order():
    records = [
        TurnRecord(turn=0, observation_ids=[7, 8], sampled_ids=[3], logprobs=[-0.5], versions=[2]),
        TurnRecord(turn=1, observation_ids=[9], sampled_ids=[4, 5], logprobs=[-0.1, -0.2],
                   versions=[3, 3]),
    ]
    seq = layout(records, advantage=1.5)
    assert seq.token_ids == [7, 8, 3, 9, 4, 5]
    assert seq.loss_mask == [False, False, True, False, True, True]
    assert seq.behaviour_logprobs == [0.0, 0.0, -0.5, 0.0, -0.1, -0.2]
    assert seq.versions == [-1, -1, 2, -1, 3, 3]


def train_activities(model_path, tmp_path) -> TrainActivities:
    blobs = LocalBlobs(tmp_path)
    return TrainActivities(Trainer(model_path, learning_rate=1e-3),
                           Publisher(blobs, None, "run", bucket_mib=1), Puller(blobs))


def test_a_new_run_starts_from_the_configured_model(model_path, tmp_path):
    activities = train_activities(model_path, tmp_path)
    first = next(activities.trainer.model.parameters())
    original = first.detach().clone()

    start = activities.begin_run("run-a")
    assert start.version == 0
    with torch.no_grad():
        next(activities.trainer.model.parameters()).add_(1.0)
    activities.trainer.version = 5
    activities.begin_run("run-a")  # a retry inside the same run keeps its progress
    assert activities.trainer.version == 5

    activities.begin_run("run-b")
    assert activities.trainer.version == 0
    assert torch.equal(next(activities.trainer.model.parameters()), original)


def test_begin_run_publishes_version_zero_for_the_engines(model_path, tmp_path):
    activities = train_activities(model_path, tmp_path)
    start = activities.begin_run("first")
    manifest = Puller(LocalBlobs(tmp_path)).manifest(start.weights_prefix)
    assert manifest is not None and manifest.version == 0
    names = {t.name for b in manifest.buckets for t in b.tensors}
    assert names == {n for n, _ in activities.trainer.model.named_parameters()}


def test_a_restarted_trainer_takes_the_running_version_from_the_weight_store(model_path,
                                                                              tmp_path):
    """After a crash the new trainer process holds the base model; before training version 3 it
    must hold version 3 (what the engines serve), not silently train the base model as v3."""
    first = train_activities(model_path, tmp_path)
    first.begin_run("run")
    with torch.no_grad():
        for parameter in first.trainer.model.parameters():
            parameter.mul_(0.5)
    first.publisher.publish(3, first.trainer.named_weights())

    restarted = train_activities(model_path, tmp_path)  # a fresh process: base weights
    restarted.take_version(3)
    assert restarted.trainer.version == 3
    for (name, a), (_, b) in zip(first.trainer.model.named_parameters(),
                                 restarted.trainer.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name

    lost = train_activities(model_path, tmp_path / "empty")
    with pytest.raises(ApplicationError, match="holds no weights of version 7"):
        lost.take_version(7)


def stored_group(trainer: Trainer, store: TrajectoryStore, group: str, rewards: list[float],
                 version: int = 0, observation: str = "P F F F | F H F H | F F F H | H F F G",
                 tokens: int = 1, domain: str = "") -> list[TrainSample]:
    """One-turn trajectories whose behaviour logprobs are the trainer's own (as if its weights
    sampled them), each taking a different action (`tokens` times over)."""
    tokenizer = trainer.tokenizer
    obs = tokenizer.encode(observation)
    allowed = tokenizer.convert_tokens_to_ids(ACTIONS)
    samples = []
    for k, reward in enumerate(rewards):
        action = allowed[k % len(allowed)]
        with torch.no_grad():
            logits = trainer.model(torch.tensor([obs])).logits[0, -1]
        masked = torch.full_like(logits, float("-inf"))
        masked[allowed] = logits[allowed]
        logprob = torch.log_softmax(masked, -1)[action].item()
        tid = f"{group}.t{k}"
        store.write_turn(tid, TurnRecord(turn=0, observation_ids=obs,
                                         sampled_ids=[action] * tokens,
                                         logprobs=[logprob] * tokens, versions=[version] * tokens,
                                         allowed_ids=allowed))
        samples.append(TrainSample(trajectory_id=tid, group_id=group, reward=reward, turns=1,
                                   domain=domain))
    return samples


def test_a_step_reports_what_it_did_to_the_policy(model_path, tmp_path):
    trainer = Trainer(model_path, learning_rate=1e-2)
    store = TrajectoryStore(str(tmp_path))
    algorithm = AlgorithmConfig(group_size=4, batch_size=8, minibatches=1)
    samples = (stored_group(trainer, store, "signal", [1, 0, 0, 0])
               + stored_group(trainer, store, "flat", [0, 0, 0, 0]))
    learning = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
    assert learning.step_kl > 0
    assert 0 < learning.entropy <= math.log(len(ACTIONS)) + 1e-6
    assert learning.ratio_p50 == pytest.approx(1.0, abs=1e-4)  # it sampled them itself
    assert learning.truncated_share == 0
    assert (learning.fresh_groups, learning.fresh_groups_with_signal) == (2, 1)
    assert learning.stale_groups == 0

    # sampled by version 0, trained at version 1: stale
    again = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
    assert (again.stale_groups, again.stale_groups_with_signal) == (2, 1)
    assert again.ratio_p50 != pytest.approx(1.0, abs=1e-4)


def test_a_trust_region_pulls_a_large_step_back(model_path, tmp_path):
    store = TrajectoryStore(str(tmp_path))
    steps = {}
    for target in (None, 0.01):
        trainer = Trainer(model_path, learning_rate=1e-3)
        samples = stored_group(trainer, store, f"g{target}", [1, 0, 0, 0])
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1,
                                    learning_rate=1e-2, target_kl=target)
        steps[target] = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
    assert steps[None].step_kl > 0.1 and steps[None].step_kept == 1.0
    assert steps[0.01].step_kl <= 0.015
    assert 0 < steps[0.01].step_kept < 1


def test_a_per_domain_trust_region_bounds_the_domain_with_few_tokens(model_path, tmp_path):
    """A batch of one-token answers (with signal) beside 30-token episodes (without): over the
    batch's tokens the episodes' small KL hides the answers' large one; per domain it does
    not."""
    steps = {}
    for region in ("batch", "domain"):
        store = TrajectoryStore(str(tmp_path / region))
        trainer = Trainer(model_path, learning_rate=1e-3)
        samples = (stored_group(trainer, store, "a", [1, 0, 0, 0], domain="answers")
                   + stored_group(trainer, store, "b", [0, 0, 0, 0], tokens=30,
                                  observation="3 + 4 = ? The sum of the two numbers",
                                  domain="episodes"))
        algorithm = AlgorithmConfig(group_size=4, batch_size=8, minibatches=1,
                                    learning_rate=1e-2, target_kl=0.02, trust_region=region)
        steps[region] = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
    batch, domain = steps["batch"], steps["domain"]
    assert batch.step_kl <= 1.5 * 0.02
    assert batch.step_kl_by_domain["answers"] > 10 * 0.02
    assert max(domain.step_kl_by_domain.values()) == pytest.approx(domain.step_kl)
    assert domain.step_kl <= 1.5 * 0.02
    assert domain.step_kept < batch.step_kept


def test_stale_tokens_shrink_the_trust_region_by_their_lag(model_path, tmp_path):
    """Tokens sampled two versions behind the trainer: with target_kl_lag_power 2 the step's
    budget is target_kl / 3 ** 2."""
    store = TrajectoryStore(str(tmp_path))
    steps = {}
    for power in (0.0, 2.0):
        trainer = Trainer(model_path, learning_rate=1e-3)
        trainer.version = 3
        samples = stored_group(trainer, store, f"g{power}", [1, 0, 0, 0], version=1)
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1,
                                    learning_rate=1e-2, target_kl=0.09,
                                    target_kl_lag_power=power)
        steps[power] = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
    assert steps[0.0].mean_lag == steps[2.0].mean_lag == 2
    assert steps[0.0].step_kl > 0.015
    assert steps[2.0].step_kl <= 1.5 * 0.09 / 9
    assert steps[2.0].step_kept < steps[0.0].step_kept


def test_an_entropy_bonus_moves_a_policy_that_has_no_signal(model_path, tmp_path):
    store = TrajectoryStore(str(tmp_path))
    for coef, moves in ((0.0, False), (0.1, True)):
        trainer = Trainer(model_path, learning_rate=1e-2)
        before = [p.detach().clone() for p in trainer.model.parameters()]
        samples = stored_group(trainer, store, f"flat{coef}", [0, 0, 0, 0])
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1,
                                    entropy_coef=coef)
        learning = trainer.train_step(store, samples, algorithm, temperature=1.0).learning
        moved = any(not torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(),
                                                           strict=True))
        assert moved == moves
        assert (learning.step_kl > 0) == moves


def test_adaptive_entropy_control_raises_the_bonus_only_below_the_target(model_path, tmp_path):
    store = TrajectoryStore(str(tmp_path))
    uniform = math.log(len(ACTIONS))  # the untrained policy is close to uniform
    coefs = {}
    for target in (uniform + 1, 0.01):  # always below / always above it
        trainer = Trainer(model_path, learning_rate=1e-3)
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1,
                                    entropy_target=target, entropy_coef_step=0.01)
        coefs[target] = [
            trainer.train_step(store, stored_group(trainer, store, f"g{target}.{step}",
                                                   [1, 0, 0, 0]),
                               algorithm, temperature=1.0).learning.entropy_coef
            for step in range(3)]
    assert coefs[uniform + 1] == pytest.approx([0.01, 0.02, 0.03])
    assert coefs[0.01] == [0.0, 0.0, 0.0]


def test_a_batch_without_signal_leaves_the_weights_as_they_were(model_path, tmp_path):
    """Adam's momentum would move them on a zero gradient, after any step that had signal."""
    trainer = Trainer(model_path, learning_rate=1e-3)
    store = TrajectoryStore(str(tmp_path))
    algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1)
    trainer.train_step(store, stored_group(trainer, store, "signal", [1, 0, 0, 0]), algorithm,
                       temperature=1.0)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    flat = trainer.train_step(store, stored_group(trainer, store, "flat", [0, 0, 0, 0]),
                              algorithm, temperature=1.0)
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.model.parameters(),
                                                 strict=True))
    assert flat.learning.step_kl == 0 and flat.version == 2


def test_more_epochs_reuse_the_batch_and_stay_clipped_to_the_pre_step_policy(model_path,
                                                                              tmp_path):
    """Each pass takes its own optimizer steps (so four passes move the policy further than
    one), all measured against the policy before the step: once the ratio leaves the clip
    range, later passes stop pushing it."""
    store = TrajectoryStore(str(tmp_path))
    steps = {}
    for epochs in (1, 4):
        trainer = Trainer(model_path, learning_rate=1e-3)
        samples = stored_group(trainer, store, f"e{epochs}", [1, 0, 0, 0])
        algorithm = AlgorithmConfig(group_size=4, batch_size=4, minibatches=1, epochs=epochs,
                                    learning_rate=3e-2, target_kl=None)
        steps[epochs] = trainer.train_step(store, samples, algorithm, temperature=1.0)
    assert steps[4].learning.step_kl > 2 * steps[1].learning.step_kl
    assert steps[1].clip_fraction == 0  # a single pass starts at ratio 1 everywhere
    assert steps[4].clip_fraction > 0
    assert steps[4].trained_tokens == steps[1].trained_tokens == 4  # counted once
