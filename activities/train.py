"""The train-step activity, served by the trainer process that holds the model and optimizer.

Each step publishes the new version to the weight store (buckets plus a manifest) and retires
versions no replica needs any more; every `checkpoint_every` versions it also checkpoints model
and optimizer to the storage location. A retried step for an iteration already trained returns
the first result instead of training twice on the same batch. A trainer process that restarted
mid-run first takes the step's version from the weight store (the weights the engines serve),
with the optimizer from a checkpoint of that version when there is one, so the policy version
stays consistent with the engines.
"""

from __future__ import annotations

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.blobs import BlobStore
from rollart.contracts import Activity, TrainRequest, TrainResult, UpdateWeightsRequest
from rollart.metrics import TRAIN_STEP_SECONDS, WEIGHT_SECONDS, timed
from rollart.policy.trainer import Trainer
from rollart.store import StoreOpener
from rollart.weights import Publisher, Puller, unpack

TRACER = trace.get_tracer("rollart")


class TrainActivities:
    def __init__(self, trainer: Trainer, publisher: Publisher, puller: Puller,
                 checkpoints: BlobStore | None = None, checkpoint_every: int = 0,
                 stores: StoreOpener | None = None) -> None:
        self.trainer, self.publisher, self.puller = trainer, publisher, puller
        self.checkpoints, self.checkpoint_every = checkpoints, checkpoint_every
        self.stores = stores or StoreOpener()
        self.run_id: str | None = None
        self.holds: int | None = None  # the run version whose weights the trainer holds
        self.done: dict[int, TrainResult] = {}

    @activity.defn(name=Activity.TRAIN_STEP)
    def step(self, request: TrainRequest) -> TrainResult:
        if request.iteration in self.done:
            return self.done[request.iteration]
        with timed(TRAIN_STEP_SECONDS):
            return self._step(request)

    def _step(self, request: TrainRequest) -> TrainResult:
        self.take_version(request.version)
        attributes = {"rollart.iteration": request.iteration, "rollart.version": request.version,
                      "rollart.samples": len(request.samples)}
        with TRACER.start_as_current_span("rollart.train_step", attributes=attributes):
            result = self.trainer.train_step(
                self.stores(request.store_dir), request.samples, request.algorithm,
                request.temperature, heartbeat=activity.heartbeat)
        with TRACER.start_as_current_span("rollart.weights.publish", attributes={
                "rollart.version": result.version}):
            manifest, push = self.publisher.publish(result.version, self.trainer.named_weights())
        self.publisher.retire(keep_from=result.version - 1)
        if (self.checkpoints is not None and self.checkpoint_every
                and result.version % self.checkpoint_every == 0):
            self.trainer.save_checkpoint(self.checkpoints, "trainer")
        result = result.model_copy(update={"weights_prefix": manifest.prefix,
                                           "push_s": push.seconds, "weight_bytes": push.bytes})
        self.holds, self.done = result.version, {request.iteration: result}
        WEIGHT_SECONDS.record(push.seconds, {"op": "push"})
        return result

    def take_version(self, version: int) -> None:
        """Make sure the trainer holds `version`'s weights before it trains on them."""
        if self.holds == version:
            return
        restored = None
        if self.checkpoints is not None:
            restored = self.trainer.load_checkpoint(self.checkpoints, "trainer", version)
        if restored is None:
            manifest = self.puller.manifest(self.publisher.prefix, version)
            if manifest is None:
                raise ApplicationError(
                    f"the trainer holds no weights of version {version} (it restarted?) and "
                    f"the weight store has none under {self.publisher.prefix}",
                    type="WeightsMissing", non_retryable=True)
            blobs, _ = self.puller.pull(manifest)
            self.trainer.load_weights(unpack(blobs), version)
            activity.logger.warning("trainer took v%d from the weight store; its optimizer "
                                    "state starts afresh (no checkpoint of v%d)", version, version)
        self.holds = version

    @activity.defn(name=Activity.TRAIN_BEGIN_RUN)
    def begin_run(self, run_id: str) -> UpdateWeightsRequest:
        """A new run starts from the configured model (not from what an earlier run left in this
        trainer) and publishes it as version 0, so the engines start from the trainer's
        weights. Retried within the same run, it changes nothing."""
        if run_id != self.run_id:
            self.trainer.reset()
            self.run_id, self.done, self.holds = run_id, {}, 0
        with TRACER.start_as_current_span("rollart.weights.publish", attributes={
                "rollart.version": self.trainer.version}):
            manifest, _ = self.publisher.publish(self.trainer.version,
                                                 self.trainer.named_weights())
        return UpdateWeightsRequest(version=self.trainer.version, weights_prefix=manifest.prefix)
