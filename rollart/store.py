"""The trajectory store: where token ids, behaviour logprobs and policy versions live.

One directory per trajectory, one small JSON file per turn, written atomically. A retried generate
activity rewrites its own turn file, so retries never duplicate tokens, and the bytes stored grow
linearly with a trajectory's length. Workflow histories carry only the trajectory id.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, Field


class TurnRecord(BaseModel):
    turn: int
    observation_ids: list[int] = Field(description="Context the env added before this turn.")
    sampled_ids: list[int]
    logprobs: list[float] = Field(description="Behaviour logprob of each sampled id.")
    versions: list[int] = Field(description="Policy version that sampled each sampled id.")
    allowed_ids: list[int] | None = Field(None, description="Sampling mask, when constrained.")


class TrajectoryStore:
    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def _dir(self, trajectory_id: str) -> Path:
        if "/" in trajectory_id or trajectory_id.startswith("."):
            raise ValueError(f"bad trajectory id {trajectory_id!r}")
        return self.root / trajectory_id

    def write_turn(self, trajectory_id: str, record: TurnRecord) -> None:
        directory = self._dir(trajectory_id)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"turn_{record.turn:05d}.json"
        staging = target.with_suffix(f".tmp{os.getpid()}")
        staging.write_text(record.model_dump_json())
        staging.replace(target)

    def read(self, trajectory_id: str, before_turn: int | None = None) -> list[TurnRecord]:
        """The trajectory's turns in order (only those before `before_turn` if given)."""
        directory = self._dir(trajectory_id)
        if not directory.is_dir():
            return []
        records = []
        for path in sorted(directory.glob("turn_*.json")):
            turn = int(path.stem.split("_")[1])
            if before_turn is not None and turn >= before_turn:
                continue
            records.append(TurnRecord.model_validate(json.loads(path.read_text())))
        return records

    def context_ids(self, trajectory_id: str, before_turn: int) -> list[int]:
        ids: list[int] = []
        for record in self.read(trajectory_id, before_turn):
            ids += record.observation_ids + record.sampled_ids
        return ids
