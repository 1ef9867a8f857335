"""A turn's store work does not grow with the run: counted (operations and bytes), not timed, on
a store pre-filled with 100,000 turn records against an empty one, on local files and on S3."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from temporalio.testing import ActivityEnvironment

from rollart.activities.generate import ContextCache, GenerateActivities
from rollart.blobs import BlobStore, LocalBlobs, open_blobs
from rollart.config import SamplingConfig
from rollart.contracts import GenerateRequest, GenerateResult
from rollart.store import StoreOpener, TrajectoryStore, TurnRecord
from rollart.weights import Puller

pytestmark = pytest.mark.asyncio(loop_scope="session")
PREFILLED = 100_000
RECORD = TurnRecord(turn=0, observation_ids=[5, 6, 7, 8], sampled_ids=[3], logprobs=[-1.4],
                    versions=[0], allowed_ids=[3, 4, 5, 6]).model_dump_json().encode()


class CountingBlobs:
    """Every call a store gets, and the bytes it moves, by kind."""

    def __init__(self, inner: BlobStore) -> None:
        self.inner, self.name, self.url = inner, inner.name, inner.url
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def put(self, key: str, data: bytes) -> None:
        self.calls["put"] += 1
        self.bytes["put"] += len(data)
        self.inner.put(key, data)

    def get(self, key: str) -> bytes | None:
        self.calls["get"] += 1
        data = self.inner.get(key)
        self.bytes["get"] += len(data or b"")
        return data

    def keys(self, prefix: str) -> list[str]:
        self.calls["keys"] += 1
        return self.inner.keys(prefix)

    def delete(self, prefix: str) -> None:
        self.calls["delete"] += 1
        self.inner.delete(prefix)

    def close(self) -> None:
        self.inner.close()


class Stores(StoreOpener):
    def __init__(self, store: TrajectoryStore) -> None:
        super().__init__()
        self.store = store

    def __call__(self, location: str) -> TrajectoryStore:
        return self.store


def prefill_local(root: Path, records: int) -> None:
    """Turn records of 10-turn trajectories, written as the store writes them."""
    for t in range(records // 10):
        directory = root / f"old-{t:06d}"
        directory.mkdir(parents=True)
        for turn in range(10):
            (directory / f"turn_{turn:05d}.json").write_bytes(RECORD)


async def store_work(engine, blobs: BlobStore, tid: str, turns: int) -> list[dict]:
    """Store calls and bytes of each of `turns` turns of one trajectory on one replica, then of
    one more turn on a replica that has never seen it (a re-route)."""
    counting = CountingBlobs(blobs)
    stores = Stores(TrajectoryStore(counting))
    replica = GenerateActivities(engine, Puller(blobs), "r0", stores, ContextCache())
    per_turn, previous = [], None
    env = ActivityEnvironment()
    for turn in range(turns + 1):
        if turn == turns:  # the last turn lands on a second replica
            replica = GenerateActivities(engine, Puller(blobs), "r1", stores, ContextCache())
        counting.calls.clear()
        counting.bytes.clear()
        previous: GenerateResult = await env.run(replica.generate, GenerateRequest(
            trajectory_id=tid, turn=turn, observation="F P F F", store_dir="unused",
            request_id=f"{tid}.{turn}.1", after=previous.request_id if previous else None,
            sampling=SamplingConfig(), action_vocabulary=["Left", "Right", "Up", "Down"]))
        per_turn.append({"calls": dict(counting.calls), "bytes": dict(counting.bytes)})
    return per_turn


async def test_a_turn_costs_the_same_on_a_full_local_store(engine, tmp_path):
    empty, full = tmp_path / "empty", tmp_path / "full"
    prefill_local(full, PREFILLED)
    assert len(list(full.iterdir())) == PREFILLED // 10
    on_empty = await store_work(engine, LocalBlobs(empty), "traj-0", 6)
    on_full = await store_work(engine, LocalBlobs(full), "traj-0", 6)
    assert [t["calls"] for t in on_full] == [t["calls"] for t in on_empty]
    for full_turn, empty_turn in zip(on_full, on_empty, strict=True):
        for kind, moved in full_turn["bytes"].items():  # equal up to a float's printed digits
            assert abs(moved - empty_turn["bytes"][kind]) <= 8 * full_turn["calls"][kind]
    first, *served_here, moved = on_full
    assert first["calls"] == {"put": 1}
    one_record = first["bytes"]["put"]
    for turn in served_here:  # the replica holds the context: one write, of this turn only
        assert turn["calls"] == {"put": 1}
        assert abs(turn["bytes"]["put"] - one_record) <= 8
    # a re-routed turn reads the earlier turns by key, one each, and lists nothing
    assert moved["calls"] == {"get": 6, "put": 1}
    assert abs(moved["bytes"]["get"] - 6 * one_record) <= 6 * 8


async def test_a_turn_costs_the_same_on_a_full_s3_prefix(engine, s3_server):
    """S3 requests counted at the HTTP layer (botocore's send events)."""
    requests: Counter[str] = Counter()

    def counted(blobs):
        blobs.client.meta.events.register(
            "before-send.s3.*", lambda request, **_: requests.update([request.method]))
        return blobs

    full = counted(open_blobs(f"s3://{s3_server.bucket}/full", s3_server.storage))
    for t in range(100):
        for turn in range(10):
            full.put(f"old-{t:04d}/turn_{turn:05d}.json", RECORD)
    empty = counted(open_blobs(f"s3://{s3_server.bucket}/empty", s3_server.storage))
    per_store = []
    for blobs in (empty, full):
        requests.clear()
        await store_work(engine, blobs, "traj-0", 4)
        per_store.append(dict(requests))
    # 5 writes, and 4 reads for the re-routed turn; never a LIST (which is also a GET)
    assert per_store[0] == per_store[1] == {"PUT": 5, "GET": 4}

