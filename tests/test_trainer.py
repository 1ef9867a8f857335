import torch

from rollart.activities.train import TrainActivities
from rollart.policy.trainer import Trainer, layout
from rollart.store import TurnRecord


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


def test_a_new_run_starts_from_the_configured_model(model_path, tmp_path):
    activities = TrainActivities(Trainer(model_path, tmp_path, learning_rate=1e-3))
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


def test_publishing_keeps_the_current_and_previous_version_only(model_path, tmp_path):
    activities = TrainActivities(Trainer(model_path, tmp_path, learning_rate=1e-3))
    activities.begin_run("first")
    for version in (29, 30):
        activities.trainer.version = version
        activities.trainer.publish()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000029", "v000030"]
    start = activities.begin_run("second")  # a new run's v0 sorts before the old versions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000000"]
    assert start.weights_path.endswith("v000000")
