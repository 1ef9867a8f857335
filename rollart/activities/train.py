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
        self.run_id: str | None = None
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

    @activity.defn(name="train.begin_run")
    def begin_run(self, run_id: str) -> UpdateWeightsRequest:
        """A new run starts from the configured model (not from what an earlier run left in this
        trainer) and publishes it as version 0, so the engines start from the trainer's
        weights. Retried within the same run, it changes nothing."""
        if run_id != self.run_id:
            self.trainer.reset()
            self.run_id, self.done = run_id, {}
        return UpdateWeightsRequest(version=self.trainer.version,
                                    weights_path=str(self.trainer.publish()))
