"""The train-step activity, served by the trainer process that holds the model and optimizer.

A retried step for an iteration already trained returns the first result instead of training
twice on the same batch.
"""

from __future__ import annotations

from temporalio import activity

from rollart.contracts import TrainRequest, TrainResult, UpdateWeightsRequest
from rollart.policy.trainer import Trainer
from rollart.store import TrajectoryStore


class TrainActivities:
    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.done: dict[int, TrainResult] = {}

    @activity.defn(name="train.step")
    def step(self, request: TrainRequest) -> TrainResult:
        if request.iteration in self.done:
            return self.done[request.iteration]
        self.trainer.version = request.version
        result = self.trainer.train_step(
            TrajectoryStore(request.store_dir), request.samples, request.algorithm,
            request.temperature, heartbeat=activity.heartbeat,
        )
        self.done = {request.iteration: result}
        return result

    @activity.defn(name="train.publish")
    def publish(self, version: int) -> UpdateWeightsRequest:
        """Publish the trainer's current weights as `version`, so a run starts with the engines
        holding exactly the trainer's weights."""
        self.trainer.version = version
        return UpdateWeightsRequest(version=version, weights_path=str(self.trainer.publish()))
