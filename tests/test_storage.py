"""Blob stores on local disk and on a real S3 server (SeaweedFS on loopback): the trajectory store
and checkpoints run on both, so workers on different machines can share them."""

from __future__ import annotations

import pytest
import torch

from rollart.blobs import LocalBlobs, S3Blobs, open_blobs
from rollart.config import StorageConfig
from rollart.store import TrajectoryStore, TurnRecord


@pytest.fixture(params=["local", "s3"])
def blobs(request, tmp_path):
    if request.param == "local":
        yield open_blobs(str(tmp_path / "blobs"))
        return
    s3 = request.getfixturevalue("s3_server")
    store = open_blobs(f"s3://{s3.bucket}/{tmp_path.name}", s3.storage)
    yield store
    store.close()


def test_blobs_put_get_list_delete(blobs):
    assert blobs.get("a/missing") is None
    blobs.put("run/t1/turn_00000.json", b"one")
    blobs.put("run/t1/turn_00001.json", b"two")
    blobs.put("run/t2/turn_00000.json", b"three")
    blobs.put("run/t2/turn_00000.json", b"three again")
    assert blobs.get("run/t2/turn_00000.json") == b"three again"
    assert blobs.keys("run/t1/") == ["run/t1/turn_00000.json", "run/t1/turn_00001.json"]
    assert len(blobs.keys("run/")) == 3
    blobs.delete("run/t1/")
    assert blobs.keys("run/") == ["run/t2/turn_00000.json"]
    payload = bytes(range(256)) * 4096
    blobs.put("big", payload)
    assert blobs.get("big") == payload


def test_trajectory_store_on_either_backend(blobs):
    store = TrajectoryStore(blobs)
    for turn in range(3):
        store.write_turn("traj-1", TurnRecord(
            turn=turn, observation_ids=[1, 2], sampled_ids=[3 + turn], logprobs=[-0.5],
            versions=[turn], allowed_ids=[3, 4, 5]))
    store.write_turn("traj-1", TurnRecord(  # a retried turn rewrites itself
        turn=2, observation_ids=[1, 2], sampled_ids=[9], logprobs=[-0.1], versions=[2]))
    records = store.read("traj-1")
    assert [r.turn for r in records] == [0, 1, 2] and records[2].sampled_ids == [9]
    assert store.context_ids("traj-1", before_turn=2) == [1, 2, 3, 1, 2, 4]
    assert store.read("nobody") == []


def test_s3_settings_come_from_config_or_environment(s3_server, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-env")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "from-env-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.storage.endpoint_url)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    store = open_blobs(f"s3://{s3_server.bucket}/env-only")
    assert isinstance(store, S3Blobs)
    store.put("k", b"v")
    assert store.get("k") == b"v"
    assert isinstance(open_blobs("/tmp/somewhere"), LocalBlobs)
    with pytest.raises(ValueError, match="names no bucket"):
        open_blobs("s3:///prefix")


def test_secrets_never_leave_the_process(s3_server):
    config = StorageConfig(endpoint_url="http://127.0.0.1:1", access_key_id="AKIA",
                           secret_access_key="very-secret")
    assert "very-secret" not in config.model_dump_json()
    assert "very-secret" not in repr(config)


def test_checkpoint_round_trip(blobs, model_path, tmp_path):
    from rollart.policy.trainer import Trainer

    trainer = Trainer(model_path, learning_rate=1e-3)
    with torch.no_grad():
        next(trainer.model.parameters()).add_(1.0)
    trainer.version = 7
    trainer.save_checkpoint(blobs, "ckpt")
    restored = Trainer(model_path, learning_rate=1e-3)
    assert restored.load_checkpoint(blobs, "ckpt") == 7
    for (name, a), (_, b) in zip(trainer.model.state_dict().items(),
                                 restored.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
