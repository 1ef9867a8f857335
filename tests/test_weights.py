"""The weight path: buckets and manifests through both backends, bitwise; lost or corrupted
buckets are caught; an engine updated from the store samples exactly like a fresh one."""

from __future__ import annotations

import pytest
import torch

from rollart.blobs import LocalBlobs
from rollart.servers import free_port
from rollart.weights import (
    CorruptWeightsError,
    MooncakeBackend,
    MooncakeMaster,
    Publisher,
    Puller,
    mooncake_installed,
    unpack,
)

needs_mooncake = pytest.mark.skipif(not mooncake_installed(), reason="Mooncake not installed")


@pytest.fixture(scope="module")
def mooncake(tmp_path_factory):
    if not mooncake_installed():
        pytest.skip("Mooncake not installed")
    log = tmp_path_factory.mktemp("mooncake") / "master.log"
    with MooncakeMaster(free_port(), log) as master:
        backend = MooncakeBackend(master.address, segment_mib=64, buffer_mib=32)
        yield backend
        backend.close()


def state_dict() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(300, 64, generator=generator),
        "layer.0.weight": torch.randn(64, 64, generator=generator).to(torch.bfloat16),
        "layer.0.bias": torch.randn(64, generator=generator),
        "steps": torch.arange(10, dtype=torch.int64),
        "odd.values": torch.tensor([float("nan"), float("inf"), -0.0]),
    }


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and a.contiguous().view(torch.uint8).equal(b.contiguous().view(torch.uint8)))


def round_trip(primary, durable=None, bucket_mib=0.02) -> None:
    tensors = state_dict()
    publisher = Publisher(primary, durable, prefix="rt", bucket_mib=bucket_mib)
    manifest, push = publisher.publish(3, tensors.items())
    assert len(manifest.buckets) > 1 and push.bytes == manifest.total_bytes
    assert {t.name for b in manifest.buckets for t in b.tensors} == set(tensors)
    puller = Puller(primary, durable)
    found = puller.manifest("rt")
    assert found == manifest
    blobs, stats = puller.pull(found)
    assert stats.bytes == manifest.total_bytes and stats.retries == 0
    pulled = dict(unpack(blobs))
    assert set(pulled) == set(tensors)
    assert all(bitwise_equal(pulled[name], tensors[name]) for name in tensors)


def test_round_trip_local_files_is_bitwise(tmp_path):
    round_trip(LocalBlobs(tmp_path))


@needs_mooncake
def test_round_trip_mooncake_is_bitwise(mooncake):
    round_trip(mooncake)


def test_corrupted_bucket_is_caught(tmp_path):
    backend = LocalBlobs(tmp_path)
    manifest, _ = Publisher(backend, None, "c", bucket_mib=0.02).publish(1, state_dict().items())
    victim = tmp_path / manifest.buckets[1].key
    data = bytearray(victim.read_bytes())
    data[100] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(CorruptWeightsError, match="checksum mismatch"):
        Puller(backend).pull(manifest)
    victim.write_bytes(bytes(data[:-10]))
    with pytest.raises(CorruptWeightsError, match="bytes, the manifest says"):
        Puller(backend).pull(manifest)


@needs_mooncake
def test_evicted_bucket_comes_from_the_durable_copy(mooncake, tmp_path):
    durable = LocalBlobs(tmp_path)
    publisher = Publisher(mooncake, durable, "ev", bucket_mib=0.02)
    manifest, _ = publisher.publish(1, state_dict().items())
    lost = manifest.buckets[0].key
    mooncake.store.remove(lost, True)  # what a silent eviction leaves behind
    assert mooncake.get(lost) is None
    blobs, stats = Puller(mooncake, durable).pull(manifest)
    assert stats.from_durable == 1 and stats.retries == 1
    assert set(dict(unpack(blobs))) == set(state_dict())
    (tmp_path / lost).unlink()
    with pytest.raises(CorruptWeightsError, match="missing"):
        Puller(mooncake, durable).pull(manifest)


def test_retired_versions_are_deleted(tmp_path):
    backend = LocalBlobs(tmp_path)
    publisher = Publisher(backend, None, "gc", bucket_mib=1)
    for version in range(4):
        publisher.publish(version, state_dict().items())
    publisher.retire(keep_from=3)
    puller = Puller(backend)
    assert [puller.manifest("gc", v) is not None for v in range(4)] == [False] * 3 + [True]
    assert sorted(p.name for p in (tmp_path / "gc").iterdir()) == ["latest", "v000003"]


@pytest.mark.asyncio(loop_scope="session")
async def test_engine_updated_from_the_store_matches_a_fresh_engine(engine, model_path, tmp_path):
    """The whole path (publish buckets, pull while serving, suspend only to load) leaves the
    engine greedy-decoding exactly like an engine started from the same weights."""
    from temporalio.testing import ActivityEnvironment

    from rollart.activities.generate import GenerateActivities
    from rollart.config import EngineConfig
    from rollart.contracts import UpdateWeightsRequest
    from rollart.policy.engine import PolicyEngine
    from rollart.policy.trainer import Trainer

    trainer = Trainer(model_path, learning_rate=1e-3)
    torch.manual_seed(5)
    with torch.no_grad():
        for parameter in trainer.model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.3)
    blobs = LocalBlobs(tmp_path / "store")
    version = engine.version + 1
    Publisher(blobs, None, "greedy", bucket_mib=0.05).publish(version, trainer.named_weights())
    activities = GenerateActivities(engine, Puller(blobs))
    result = await ActivityEnvironment().run(
        activities.update_weights, UpdateWeightsRequest(version=version, weights_prefix="greedy"))
    assert result.bytes > 0 and result.pull_s > 0 and result.seconds > 0

    trainer.model.save_pretrained(tmp_path / "fresh")
    trainer.tokenizer.save_pretrained(tmp_path / "fresh")
    fresh = await PolicyEngine(str(tmp_path / "fresh"), EngineConfig()).start()  # same shapes
    prompts = ["P F F F | F H F H", "F F F H | H F F G", "3 + 4 =", "Left Right Up"]
    try:
        for prompt in prompts:
            ids = engine.encode(prompt)
            ours = await engine.generate(ids, max_tokens=24, temperature=0.0, ignore_eos=True)
            theirs = await fresh.generate(ids, max_tokens=24, temperature=0.0, ignore_eos=True)
            assert ours.token_ids == theirs.token_ids, prompt
            assert ours.versions == [version] * 24
    finally:
        fresh.shutdown()
        original = Trainer(model_path, learning_rate=1e-3)
        Publisher(blobs, None, "greedy", bucket_mib=1).publish(0, original.named_weights())
        await ActivityEnvironment().run(
            activities.update_weights, UpdateWeightsRequest(version=0, weights_prefix="greedy"))
