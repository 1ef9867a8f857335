import pytest
import torch
from temporalio.exceptions import ApplicationError

from rollart.activities.train import TrainActivities
from rollart.blobs import LocalBlobs
from rollart.policy.trainer import Trainer, layout
from rollart.store import TurnRecord
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
