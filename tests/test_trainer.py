import torch

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
    return TrainActivities(Trainer(model_path, learning_rate=1e-3),
                           Publisher(LocalBlobs(tmp_path), None, "run", bucket_mib=1))


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
