"""The trajectory store: where token ids, behaviour logprobs and policy versions live.

One small JSON blob per turn under the trajectory's id, on local disk or S3 (rollart.blobs),
written whole. A retried generate activity rewrites its own turn, so retries never duplicate
tokens, and the bytes stored grow linearly with a trajectory's length. Workflow histories carry
only the trajectory id.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from rollart.blobs import BlobStore, open_blobs
from rollart.config import StorageConfig


class TurnRecord(BaseModel):
    turn: int
    observation_ids: list[int] = Field(description="Context the env added before this turn.")
    sampled_ids: list[int]
    logprobs: list[float] = Field(description="Behaviour logprob of each sampled id.")
    versions: list[int] = Field(description="Policy version that sampled each sampled id.")
    allowed_ids: list[int] | None = Field(None, description="Sampling mask, when constrained.")


class TrajectoryStore:
    def __init__(self, location: str | BlobStore, storage: StorageConfig | None = None) -> None:
        self.blobs = open_blobs(location, storage) if isinstance(location, str) else location

    @staticmethod
    def _prefix(trajectory_id: str) -> str:
        if "/" in trajectory_id or trajectory_id.startswith("."):
            raise ValueError(f"bad trajectory id {trajectory_id!r}")
        return f"{trajectory_id}/"

    def write_turn(self, trajectory_id: str, record: TurnRecord) -> None:
        key = f"{self._prefix(trajectory_id)}turn_{record.turn:05d}.json"
        self.blobs.put(key, record.model_dump_json().encode())

    def read(self, trajectory_id: str, before_turn: int | None = None) -> list[TurnRecord]:
        """The trajectory's turns in order (only those before `before_turn` if given)."""
        records = []
        for key in self.blobs.keys(self._prefix(trajectory_id)):
            turn = int(key.rsplit("_", 1)[1].removesuffix(".json"))
            if before_turn is not None and turn >= before_turn:
                continue
            data = self.blobs.get(key)
            if data is not None:
                records.append(TurnRecord.model_validate_json(data))
        return records

    def context_ids(self, trajectory_id: str, before_turn: int) -> list[int]:
        ids: list[int] = []
        for record in self.read(trajectory_id, before_turn):
            ids += record.observation_ids + record.sampled_ids
        return ids


class StoreOpener:
    """Trajectory stores by location, opened once per worker (an S3 client is not free)."""

    def __init__(self, storage: StorageConfig | None = None) -> None:
        self.storage = storage
        self._open: dict[str, TrajectoryStore] = {}

    def __call__(self, location: str) -> TrajectoryStore:
        if location not in self._open:
            self._open[location] = TrajectoryStore(location, self.storage)
        return self._open[location]
