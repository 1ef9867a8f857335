"""The train-step activity, served by the trainer process that holds the model and optimizer.

Each step publishes the new version to the weight store (buckets plus a manifest) and retires
versions no replica needs any more; every `checkpoint_every` versions it also checkpoints model
and optimizer to the storage location. A retried step for an iteration already trained returns
the first result instead of training twice on the same batch.
"""

from __future__ import annotations

from temporalio import activity

from rollart.blobs import BlobStore
from rollart.contracts import TrainRequest, TrainResult, UpdateWeightsRequest
from rollart.policy.trainer import Trainer
from rollart.store import StoreOpener
from rollart.weights import Publisher


class TrainActivities:
    def __init__(self, trainer: Trainer, publisher: Publisher,
                 checkpoints: BlobStore | None = None, checkpoint_every: int = 0,
                 stores: StoreOpener | None = None) -> None:
        self.trainer, self.publisher = trainer, publisher
        self.checkpoints, self.checkpoint_every = checkpoints, checkpoint_every
        self.stores = stores or StoreOpener()
        self.run_id: str | None = None
        self.done: dict[int, TrainResult] = {}

    @activity.defn(name="train.step")
    def step(self, request: TrainRequest) -> TrainResult:
        if request.iteration in self.done:
            return self.done[request.iteration]
        self.trainer.version = request.version
        result = self.trainer.train_step(
            self.stores(request.store_dir), request.samples, request.algorithm,
            request.temperature, heartbeat=activity.heartbeat)
        manifest, push = self.publisher.publish(result.version, self.trainer.named_weights())
        self.publisher.retire(keep_from=result.version - 1)
        if (self.checkpoints is not None and self.checkpoint_every
                and result.version % self.checkpoint_every == 0):
            self.trainer.save_checkpoint(self.checkpoints, "trainer")
        result = result.model_copy(update={"weights_prefix": manifest.prefix,
                                           "push_s": push.seconds, "weight_bytes": push.bytes})
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
        manifest, _ = self.publisher.publish(self.trainer.version, self.trainer.named_weights())
        return UpdateWeightsRequest(version=self.trainer.version, weights_prefix=manifest.prefix)
