"""The trajectory store: where token ids, behaviour logprobs and policy versions live.

One small JSON blob per turn under a key made of the trajectory id and the turn number, on local
disk or S3 (rollart.blobs), written whole. Every read goes to keys it can name, so nothing here
lists the store: what a turn costs does not depend on how many turns the run has stored. A
retried generate activity rewrites its own turn, so retries never duplicate tokens, and the bytes
stored grow linearly with a trajectory's length. Workflow histories carry only the trajectory id.
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

    @property
    def ids(self) -> list[int]:
        """What the turn added to the context: the observation, then the sampled tokens."""
        return self.observation_ids + self.sampled_ids


class TrajectoryStore:
    def __init__(self, location: str | BlobStore, storage: StorageConfig | None = None) -> None:
        self.blobs = open_blobs(location, storage) if isinstance(location, str) else location

    @staticmethod
    def key(trajectory_id: str, turn: int) -> str:
        if "/" in trajectory_id or trajectory_id.startswith("."):
            raise ValueError(f"bad trajectory id {trajectory_id!r}")
        return f"{trajectory_id}/turn_{turn:05d}.json"

    def write_turn(self, trajectory_id: str, record: TurnRecord) -> None:
        self.blobs.put(self.key(trajectory_id, record.turn), record.model_dump_json().encode())

    def read(self, trajectory_id: str, turns: int | None = None) -> list[TurnRecord]:
        """The trajectory's first `turns` turns in order; with `turns` None, every turn up to
        the first one missing. A turn that should be there and is not raises."""
        records: list[TurnRecord] = []
        while turns is None or len(records) < turns:
            data = self.blobs.get(self.key(trajectory_id, len(records)))
            if data is None:
                if turns is None:
                    break
                raise FileNotFoundError(f"trajectory {trajectory_id}: turn {len(records)} of "
                                        f"{turns} is not in the store at {self.blobs.url}")
            records.append(TurnRecord.model_validate_json(data))
        return records

    def context_ids(self, trajectory_id: str, before_turn: int) -> list[int]:
        """The context the engine saw before turn `before_turn`: one read per earlier turn, so
        only for a turn whose replica does not hold the context already."""
        return [i for record in self.read(trajectory_id, before_turn) for i in record.ids]


class StoreOpener:
    """Trajectory stores by location, opened once per worker (an S3 client is not free)."""

    def __init__(self, storage: StorageConfig | None = None) -> None:
        self.storage = storage
        self._open: dict[str, TrajectoryStore] = {}

    def __call__(self, location: str) -> TrajectoryStore:
        if location not in self._open:
            self._open[location] = TrajectoryStore(location, self.storage)
        return self._open[location]
