"""TrainingWorkflow: the single controller of a run.

Each iteration starts one GRPO batch of TrajectoryWorkflow children (group_size siblings share an
env seed), waits for them, forms the batch, runs one train step on the trainer fleet and moves the
new weights into every generation replica (suspend -> update -> resume). State is small (a ledger,
recent metrics) and is carried across continue-as-new.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from rollart.config import RunConfig
    from rollart.contracts import (
        IterationMetrics,
        Ledger,
        TrainingStatus,
        TrainRequest,
        TrainResult,
        TrainSample,
        TrajectoryResult,
        TrajectorySpec,
        UpdateWeightsRequest,
        UpdateWeightsResult,
    )
    from rollart.queues import pool_queue, replica_queue
    from rollart.workflows.batching import form_batch
    from rollart.workflows.trajectory import TrajectoryWorkflow

TRAIN_TIMEOUT = timedelta(minutes=30)
TRAIN_HEARTBEAT = timedelta(minutes=2)
UPDATE_TIMEOUT = timedelta(minutes=5)
CHECK_TIMEOUT = timedelta(minutes=10)
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                    maximum_attempts=3)
KEPT_HISTORY = 200
KEPT_FAILURES = 20


class TrainingState(BaseModel):
    iteration: int = 0
    version: int = 0
    ledger: Ledger = Field(default_factory=Ledger)
    history: list[IterationMetrics] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    done: bool = False


class TrainingInput(BaseModel):
    config: RunConfig
    state: TrainingState | None = None


@workflow.defn
class TrainingWorkflow:
    def __init__(self) -> None:
        self.config: RunConfig | None = None
        self.state = TrainingState()

    @workflow.query
    def status(self) -> TrainingStatus:
        iterations = self.config.algorithm.iterations if self.config else 0
        return TrainingStatus(
            iteration=self.state.iteration, iterations=iterations, version=self.state.version,
            done=self.state.done, ledger=self.state.ledger, history=self.state.history,
            failures=self.state.failures,
        )

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingStatus:
        self.config = cfg = inp.config
        self.state = inp.state or TrainingState()
        if self.state.iteration == 0:
            await workflow.execute_activity(
                "env.check", cfg.env.name, task_queue=pool_queue("env", cfg.env.pool),
                start_to_close_timeout=CHECK_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
            initial = await workflow.execute_activity(
                "train.begin_run", workflow.info().workflow_id, result_type=UpdateWeightsRequest,
                task_queue=pool_queue("train", cfg.trainer.pool),
                start_to_close_timeout=UPDATE_TIMEOUT, retry_policy=RETRY,
            )
            await self._update_replicas(cfg, initial)
        while self.state.iteration < cfg.algorithm.iterations and not self.state.done:
            metrics = await self._iteration(cfg)
            self.state.history = (self.state.history + [metrics])[-KEPT_HISTORY:]
            self.state.iteration += 1
            target = cfg.algorithm.stop_at_success
            if target is not None and metrics.success_rate >= target:
                self.state.done = True
            if workflow.info().is_continue_as_new_suggested() and not self.state.done:
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(TrainingInput(config=cfg, state=self.state))
        self.state.done = True
        return self.status()

    async def _iteration(self, cfg: RunConfig) -> IterationMetrics:
        started = workflow.now()
        results = await self._rollout(cfg)
        batch = form_batch(results)
        rolled_out = workflow.now()
        ledger = self.state.ledger
        ledger.failed += len(batch.failed)
        ledger.evicted += len(batch.evicted)
        train = None
        if batch.trainable:
            train = await workflow.execute_activity(
                "train.step",
                TrainRequest(
                    iteration=self.state.iteration, version=self.state.version,
                    store_dir=str(cfg.store_dir), algorithm=cfg.algorithm,
                    temperature=cfg.sampling.temperature,
                    samples=[TrainSample(trajectory_id=r.trajectory_id, group_id=r.group_id,
                                         reward=r.reward) for r in batch.trainable],
                ),
                result_type=TrainResult, task_queue=pool_queue("train", cfg.trainer.pool),
                start_to_close_timeout=TRAIN_TIMEOUT, heartbeat_timeout=TRAIN_HEARTBEAT,
                retry_policy=RETRY,
            )
            ledger.trained += len(batch.trainable)
        trained = workflow.now()
        if train is not None:
            await self._update_replicas(
                cfg, UpdateWeightsRequest(version=train.version, weights_path=train.weights_path))
            self.state.version = train.version
        updated = workflow.now()
        completed = batch.trainable + batch.evicted
        rollout_s = (rolled_out - started).total_seconds()
        tokens = sum(r.generated_tokens for r in results)
        return IterationMetrics(
            iteration=self.state.iteration, ended_at=updated, version=self.state.version,
            reward_mean=_mean([r.reward for r in completed]),
            success_rate=_mean([float(r.success) for r in completed]),
            trajectories=len(results), generated_tokens=tokens,
            rollout_s=rollout_s, train_s=(trained - rolled_out).total_seconds(),
            weight_update_s=(updated - trained).total_seconds(),
            step_s=(updated - started).total_seconds(),
            tokens_per_s=tokens / rollout_s if rollout_s > 0 else 0.0,
            loss=train.loss if train else 0.0,
        )

    async def _rollout(self, cfg: RunConfig) -> list[TrajectoryResult]:
        algo, env = cfg.algorithm, cfg.env
        replicas = cfg.pool("gen", env.gen_pool).replicas
        run_id = workflow.info().workflow_id
        handles = []
        for group in range(algo.batch_size // algo.group_size):
            seed = workflow.random().randint(0, 2**31 - 1)
            group_id = f"{run_id}.it{self.state.iteration:05d}.g{group:03d}"
            for member in range(algo.group_size):
                tid = f"{group_id}.t{member:02d}"
                spec = TrajectorySpec(
                    trajectory_id=tid, group_id=group_id, seed=seed, env_name=env.name,
                    env_kwargs=env.kwargs, max_turns=env.max_turns,
                    env_queue=pool_queue("env", env.pool),
                    gen_queue=replica_queue("gen", env.gen_pool, len(handles) % replicas),
                    reward_queue=pool_queue("reward", env.reward_pool),
                    store_dir=str(cfg.store_dir), sampling=cfg.sampling,
                )
                handles.append(workflow.start_child_workflow(
                    TrajectoryWorkflow.run, spec, id=tid,
                    task_queue=cfg.temporal.control_queue,
                    parent_close_policy=ParentClosePolicy.REQUEST_CANCEL,
                ))
                self.state.ledger.started += 1
        started = await asyncio.gather(*handles)
        outcomes = await asyncio.gather(*started, return_exceptions=True)
        results = []
        for handle, outcome in zip(started, outcomes, strict=True):
            if isinstance(outcome, TrajectoryResult):
                results.append(outcome)
                continue
            error = _describe(outcome)
            self.state.failures = (self.state.failures + [f"{handle.id}: {error}"])[-KEPT_FAILURES:]
            results.append(TrajectoryResult(trajectory_id=handle.id,
                                            group_id=handle.id.rsplit(".", 1)[0],
                                            status="failed", error=error))
        return results

    async def _update_replicas(self, cfg: RunConfig, request: UpdateWeightsRequest) -> None:
        """Suspend -> update -> resume on every replica of the generation pool."""
        pool = cfg.env.gen_pool
        await asyncio.gather(*(
            workflow.execute_activity(
                "gen.update_weights", request, result_type=UpdateWeightsResult,
                task_queue=replica_queue("gen", pool, replica),
                start_to_close_timeout=UPDATE_TIMEOUT, retry_policy=RETRY,
            )
            for replica in range(cfg.pool("gen", pool).replicas)
        ))


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _describe(error: BaseException) -> str:
    if isinstance(error, ChildWorkflowError) and error.cause is not None:
        return str(getattr(error.cause, "message", error.cause))
    return f"{type(error).__name__}: {error}"
