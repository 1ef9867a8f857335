"""A trainer that spends a train step's time by the cost model instead of computing it.

It reads the batch from the trajectory store as the real trainer does (the store path stays
real) and counts its tokens; the step then lasts as long as training that many simulated tokens
and pushing the simulated model would. Its weights (the tiny model's, unchanged) still go
through the real weight path, so publish, pull, suspend, update and resume all run.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rollart.config import AlgorithmConfig, SimulationConfig
from rollart.contracts import TrainResult, TrainSample
from rollart.policy.trainer import Trainer, layout
from rollart.simulation.costs import train_cost
from rollart.store import TrajectoryStore

HEARTBEAT_EVERY_S = 1.0


class SimulatedTrainer(Trainer):
    def __init__(self, model_path: str, simulation: SimulationConfig, seed: int = 0) -> None:
        super().__init__(model_path, learning_rate=1e-3, seed=seed, threads=1)
        self.simulation = simulation
        self.cost = train_cost(simulation)

    def train_step(self, store: TrajectoryStore, samples: list[TrainSample],
                   algorithm: AlgorithmConfig, temperature: float,
                   heartbeat: Callable[[], None] = lambda: None) -> TrainResult:
        started = time.perf_counter()
        tokens, sampled, stale = 0, 0, 0
        for sample in samples:
            records = store.read(sample.trajectory_id, sample.turns)
            if not records:
                raise ValueError(f"trajectory {sample.trajectory_id} has no stored turns")
            sequence = layout(records, 0.0)
            tokens += len(sequence.token_ids)
            versions = sequence.sampled_versions
            sampled += len(versions)
            stale += sum(v < self.version for v in versions)
        simulated = tokens * self.simulation.token_scale
        seconds = ((self.cost.train_s(simulated) + self.cost.transfer_s())
                   * self.simulation.time_scale)
        deadline = started + seconds
        while (left := deadline - time.perf_counter()) > 0:
            time.sleep(min(left, HEARTBEAT_EVERY_S))
            heartbeat()
        self.version += 1
        return TrainResult(version=self.version, loss=0.0, grad_norm=0.0, clip_fraction=0.0,
                           trained_tokens=tokens, logprob_mismatch=0.0,
                           stale_token_share=stale / max(sampled, 1),
                           seconds=time.perf_counter() - started)
