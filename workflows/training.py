"""TrainingWorkflow: the single controller of a run.

Two loops share the workflow's state. The supply loop keeps GRPO groups of TrajectoryWorkflow
children running (group_size + redundancy siblings share a task domain and an env seed; domains are
drawn by their weights); what it may start depends on the mode. The training loop takes complete,
admissible groups from the sample buffer as soon as a batch's worth exists, trains, moves the new
weights into every replica (suspend -> update -> resume) and evicts what the new version made too
stale (cancelling it where it still runs). Children report their end by signal, so state (the
buffer, a ledger, recent metrics) survives continue-as-new while children keep running
(ParentClosePolicy.ABANDON)."""

from __future__ import annotations

import asyncio
import builtins
import itertools
import math
from collections import Counter
from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    ChildWorkflowError,
    TimeoutError,
)
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from temporalio.contrib.opentelemetry import workflow as traced_workflow

    from rollart.config import AlgorithmConfig, RunConfig
    from rollart.contracts import (
        Activity,
        DomainMetrics,
        IterationMetrics,
        Ledger,
        ProfileMetrics,
        RewardMetrics,
        RolloutShape,
        TrainingStatus,
        TrainRequest,
        TrainResult,
        TrainSample,
        TrajectoryResult,
        TrajectorySpec,
        UpdateWeightsRequest,
        UpdateWeightsResult,
    )
    from rollart.metrics import record_iteration, record_ledger
    from rollart.queues import admin_queue, pool_queue, replica_queue
    from rollart.search_attributes import of_batch, of_trajectory
    from rollart.workflows.batch_rollout import DROP_SIGNAL, BatchRolloutWorkflow
    from rollart.workflows.buffer import (
        DomainMix,
        Group,
        SampleBuffer,
        groups_to_start,
        next_domain,
    )
    from rollart.workflows.profiler import Accelerator, Profiler
    from rollart.workflows.scheduling import batch_rollout, remember_steps
    from rollart.workflows.trajectory import DONE_SIGNAL, TrajectoryWorkflow

TRAIN_TIMEOUT = timedelta(minutes=30)
UPDATE_TIMEOUT = timedelta(minutes=5)
UPDATE_HEARTBEAT = timedelta(seconds=20)
STARTUP_PICKUP = timedelta(minutes=10)  # engines may still be loading when a run starts
REPLICA_WAIT = timedelta(minutes=10)
REPLICA_RETRY = timedelta(seconds=5)
CHECK_TIMEOUT = timedelta(minutes=10)
RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                    maximum_attempts=3)
KEPT_HISTORY = 200
KEPT_FAILURES = 20
KEPT_REDUNDANT_IDS = 1000
CANCEL_IN_PARALLEL = "cancel-in-parallel"
REPLICA_WAIT_IN_ROUNDS = "replica-wait-in-rounds"
BALANCED_DOMAINS = "balanced-domains"
CHECK_REWARDS = "check-rewards"
TAGGED_BATCHES = "tagged-batches"
DROP_FROM_BATCHES = "drop-from-batches"
STOP_SIGNAL = "stop"


class TrainingState(BaseModel):
    iteration: int = 0
    version: int = 0
    groups_started: int = 0
    buffer: SampleBuffer
    history: list[IterationMetrics] = Field(default_factory=list)
    failures: list[str] = Field(default_factory=list)
    stop_requested: bool = Field(False, description="`rollart stop`: end after this iteration.")
    redundant_ids: list[str] = Field(default_factory=list)
    redundant_kept: RolloutShape = Field(default_factory=RolloutShape)
    redundant_cancelled: RolloutShape = Field(default_factory=RolloutShape)
    lockstep_batches: list[str] = Field(default_factory=list, description="Batch rollouts "
                                        "that may still run (mode lockstep, or batched waves).")
    batch_of: dict[str, str] = Field(default_factory=dict, description="Trajectory -> the "
                                     "batch rolling it out, until it reports.")
    env_steps: dict[str, list[float]] = Field(default_factory=dict, description="Domain -> its "
                                              "latest env step times (rollout_unit auto).")
    batching: bool = Field(False, description="Whether the supply last started a batch.")
    domain_groups: dict[str, int] = Field(default_factory=dict, description="Groups started, "
                                          "by domain.")
    domain_mix: DomainMix = Field(default_factory=DomainMix)
    exported: Ledger = Field(default_factory=Ledger, description="The ledger as the metrics "
                             "counted it last.")
    failure_totals: dict[str, int] = Field(default_factory=dict, description="The run's "
                                           "failures by reason.")
    exported_failures: dict[str, int] = Field(default_factory=dict, description="failure_totals "
                                              "as the metrics counted them last (at the end of "
                                              "the previous iteration).")
    profiler: Profiler = Field(default_factory=Profiler)
    mapping: dict[str, str] = Field(default_factory=dict, description="Domain -> the pool the "
                                    "profiler moved it to (routing.remap); others as configured.")
    done: bool = False


class TrainingInput(BaseModel):
    config: RunConfig
    state: TrainingState | None = None


@workflow.defn
class TrainingWorkflow:
    @workflow.init
    def __init__(self, inp: TrainingInput) -> None:
        # Set up before any handler runs: signals buffered across continue-as-new arrive with
        # the new run's first task.
        self.config = inp.config
        self.state = inp.state or TrainingState(
            buffer=SampleBuffer(alpha=inp.config.algorithm.alpha,
                                batch_order=inp.config.algorithm.batch_order),
            profiler=Profiler(smoothing=inp.config.routing.profile_smoothing))
        self.training = False
        self.stopping = False
        self.starting = 0

    @workflow.query
    def status(self, history_since: int = 0) -> TrainingStatus:
        """`history_since`: only iterations from this one on (a follower asking each second
        would otherwise receive the whole run's history every time)."""
        cfg, state = self.config, self.state
        return TrainingStatus(
            iteration=state.iteration, iterations=cfg.algorithm.iterations,
            version=state.version, done=state.done, ledger=state.buffer.ledger,
            history=[m for m in state.history if m.iteration >= history_since],
            failures=state.failures,
            mode=cfg.algorithm.mode, alpha=state.buffer.alpha,
            late_results=state.buffer.late_results, readmitted=len(state.buffer.readmitted),
            readmitted_ids=state.buffer.readmitted,
            redundant_kept=state.redundant_kept, redundant_cancelled=state.redundant_cancelled,
        )

    @workflow.signal(name=STOP_SIGNAL)
    def stop(self) -> None:
        """End gracefully: the iteration under way trains and updates the replicas, then the
        run evicts what is still rolling out and returns, as when its iterations are done."""
        self.state.stop_requested = True

    @workflow.signal(name=DONE_SIGNAL)
    async def trajectory_done(self, result: TrajectoryResult) -> None:
        state = self.state
        if self.config.algorithm.rollout_unit == "auto":
            remember_steps(state.env_steps, result.domain, result.env_step_times)
        state.batch_of.pop(result.trajectory_id, None)
        if result.trajectory_id in state.redundant_ids:
            state.redundant_ids.remove(result.trajectory_id)
            state.redundant_cancelled.add(result)
        if result.status == "cancelled" and state.buffer.owner(result.trajectory_id) is None:
            return  # we cancelled it and counted it when we did
        if result.status != "completed" and state.buffer.owner(result.trajectory_id):
            error = result.error or "cancelled outside the training run"
            state.failures = (state.failures + [error])[-KEPT_FAILURES:]
            reason = result.failure or "cancelled outside the training run"
            state.failure_totals[reason] = state.failure_totals.get(reason, 0) + 1
            result = result.model_copy(update={"status": "failed", "error": error})
        decision = state.buffer.record(result)
        state.redundant_ids = (state.redundant_ids + decision.cancel)[-KEPT_REDUNDANT_IDS:]
        await self._cancel(decision.cancel)

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingStatus:
        cfg, state = self.config, self.state
        if state.iteration == 0 and state.groups_started == 0:
            await self._begin(cfg)
        supply = asyncio.create_task(self._supply(cfg))
        try:
            while (state.iteration < cfg.algorithm.iterations and not state.done
                   and not state.stop_requested):
                metrics = await self._iteration(cfg)
                if cfg.telemetry.traces != "off":
                    trace_iteration(metrics)
                self._export(cfg, metrics)
                state.history = (state.history + [metrics])[-KEPT_HISTORY:]
                state.iteration += 1
                target = cfg.algorithm.stop_at_success
                if target is not None and metrics.success_rate >= target:
                    state.done = True
                if (workflow.info().is_continue_as_new_suggested() and not state.done
                        and not state.stop_requested):
                    await self._stop_supply(supply)
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(TrainingInput(config=cfg, state=state))
        finally:
            await self._stop_supply(supply)
        state.done = True
        await self._cancel(state.buffer.evict_all().cancel + state.lockstep_batches)
        await workflow.wait_condition(workflow.all_handlers_finished)
        self._export(cfg)
        return self.status()

    def _export(self, cfg: RunConfig, metrics: IterationMetrics | None = None) -> None:
        """Metrics of the iteration and the ledger's totals, once: not again when the workflow
        replays (on another worker, or after continue-as-new, its state says what was counted)
        nor when a workflow task runs again (rollart.metrics counts totals, not increments)."""
        state = self.state
        if cfg.telemetry.metrics != "off" and not workflow.unsafe.is_replaying():
            info = workflow.info()
            run, chain = info.workflow_id, info.first_execution_run_id
            if metrics is not None:
                record_iteration(run, chain, metrics)
            record_ledger(run, chain, state.buffer.ledger, state.failure_totals, state.exported,
                          state.exported_failures)
        state.exported = state.buffer.ledger.model_copy()
        state.exported_failures = dict(state.failure_totals)

    async def _begin(self, cfg: RunConfig) -> None:
        """Refuse an unknown environment or reward before anything starts; have the trainer
        start from the configured model and the engines from the trainer's weights."""
        for key, domain in cfg.domains.items():
            await workflow.execute_activity(
                Activity.ENV_CHECK, args=[domain.env, f"domains.{key}.env"],
                task_queue=pool_queue("env", domain.pool), start_to_close_timeout=CHECK_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=3),
            )
            if workflow.patched(CHECK_REWARDS):
                await workflow.execute_activity(
                    Activity.REWARD_CHECK, args=[domain.reward, f"domains.{key}.reward"],
                    task_queue=pool_queue("reward", domain.reward_pool),
                    start_to_close_timeout=CHECK_TIMEOUT,
                    retry_policy=RetryPolicy(maximum_attempts=3),
                )
        initial = await workflow.execute_activity(
            Activity.TRAIN_BEGIN_RUN, workflow.info().workflow_id, result_type=UpdateWeightsRequest,
            task_queue=pool_queue("train", cfg.trainer.pool),
            start_to_close_timeout=UPDATE_TIMEOUT, retry_policy=RETRY,
        )
        await self._update_replicas(cfg, initial, pickup=STARTUP_PICKUP)

    async def _stop_supply(self, supply: asyncio.Task) -> None:
        """Stop starting groups, but never in the middle of starting one: a group whose members
        were not all started would wait for them forever."""
        self.stopping = True
        await workflow.wait_condition(lambda: self.starting == 0)
        supply.cancel()

    def _groups_to_start(self, cfg: RunConfig) -> int:
        if self.stopping:
            return 0
        algo = cfg.algorithm
        return groups_to_start(algo.mode, algo.alpha, algo.groups_per_batch,
                               self.state.buffer.outstanding_groups(), self.training)

    async def _supply(self, cfg: RunConfig) -> None:
        while True:
            await workflow.wait_condition(lambda: self._groups_to_start(cfg) > 0)
            count = self._groups_to_start(cfg)
            self.starting += count
            try:
                if cfg.algorithm.mode == "lockstep" or self._batching(cfg, count):
                    await self._start_lockstep(cfg, count)
                else:
                    await asyncio.gather(*(self._start_group(cfg) for _ in range(count)))
            finally:
                self.starting -= count

    def _batching(self, cfg: RunConfig, groups: int) -> bool:
        algo, state = cfg.algorithm, self.state
        batching = batch_rollout(algo.rollout_unit, state.env_steps, list(cfg.domains),
                                 groups * (algo.group_size + algo.redundancy),
                                 algo.batch_turn_overhead_s)
        if batching != state.batching and algo.rollout_unit == "auto":
            workflow.logger.warning("rollout: %s from now on (the env steps measured so far)",
                                    "batches" if batching else "one workflow per trajectory")
        state.batching = batching
        return batching

    async def _start_group(self, cfg: RunConfig) -> None:
        specs, tags = self._new_group(cfg)
        handles = await asyncio.gather(*(
            workflow.start_child_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=cfg.temporal.control_queue,
                parent_close_policy=ParentClosePolicy.ABANDON, search_attributes=tags,
            )
            for spec in specs
        ))
        for spec, handle in zip(specs, handles, strict=True):
            asyncio.create_task(self._watch(spec, handle))

    async def _start_lockstep(self, cfg: RunConfig, count: int) -> None:
        """`count` groups as one BatchRolloutWorkflow: every trajectory takes each turn with
        the others. It reports each trajectory's end by signal, as a trajectory does, and is
        tagged with its groups' numbers so `rollart replay` can re-run one of them on its own."""
        first_group = self.state.groups_started
        specs = [spec for _ in range(count) for spec in self._new_group(cfg)[0]]
        batch_id = f"{specs[0].group_id}.lockstep"
        kept = (cfg.algorithm.alpha + 2) * cfg.algorithm.groups_per_batch
        self.state.lockstep_batches = (self.state.lockstep_batches + [batch_id])[-kept:]
        tags = None
        if cfg.temporal.search_attributes and workflow.patched(TAGGED_BATCHES):
            tags = of_batch(workflow.info().workflow_id, first_group,
                            self.state.groups_started - 1)
        handle = await workflow.start_child_workflow(
            BatchRolloutWorkflow.run, specs, id=batch_id, task_queue=cfg.temporal.control_queue,
            parent_close_policy=ParentClosePolicy.ABANDON, search_attributes=tags)
        if cfg.algorithm.mode != "lockstep":  # lockstep's batch finishes what it started
            self.state.batch_of.update({spec.trajectory_id: batch_id for spec in specs})
        for spec in specs:
            asyncio.create_task(self._watch(spec, handle))

    def _new_group(self, cfg: RunConfig) -> tuple[list[TrajectorySpec], object]:
        """Draw a group's domain and env seed and enter it in the buffer; its members' specs
        and search attributes."""
        algo, state = cfg.algorithm, self.state
        rng = workflow.random()
        weights = {name: d.weight for name, d in cfg.domains.items()}
        if algo.domain_sampling == "signal":
            domain = state.domain_mix.next_domain(weights, algo.domain_signal_floor)
        elif workflow.patched(BALANCED_DOMAINS):
            domain = next_domain(weights, state.domain_groups)
        else:
            domain = rng.choices(list(weights), weights=list(weights.values()))[0]
        state.domain_groups[domain] = state.domain_groups.get(domain, 0) + 1
        group_id = f"{workflow.info().workflow_id}.g{state.groups_started:06d}"
        seed = rng.randint(0, 2**31 - 1)
        members = [f"{group_id}.t{k:02d}" for k in range(algo.group_size + algo.redundancy)]
        state.buffer.start_group(group_id, members, state.version, algo.group_size)
        state.groups_started += 1
        specs = [TrajectorySpec.for_domain(cfg, domain, tid, group_id, seed, state.version)
                 for tid in members]
        if domain in state.mapping:  # the profiler moved it: that pool first, then the rest
            pools = sorted(specs[0].gen_pools, key=lambda p: p[0] != state.mapping[domain])
            specs = [spec.model_copy(update={"gen_pools": pools}) for spec in specs]
        tags = (of_trajectory(workflow.info().workflow_id, domain, group_id, state.version)
                if cfg.temporal.search_attributes else None)
        return specs, tags

    async def _watch(self, spec: TrajectorySpec, handle) -> None:
        """A child that ended without reporting (terminated by hand, or failed while its report
        could not be sent) is settled as failed here, so its group never waits for it."""
        try:
            await handle
        except ChildWorkflowError as err:
            if self.state.buffer.owner(spec.trajectory_id) is None:
                return  # it reported, or we evicted it
            cause = err.cause.message if err.cause is not None else str(err)
            await self.trajectory_done(TrajectoryResult(
                trajectory_id=spec.trajectory_id, group_id=spec.group_id, domain=spec.domain,
                status="failed", start_version=spec.start_version,
                error=f"trajectory {spec.trajectory_id} ended without reporting: {cause}"))

    async def _iteration(self, cfg: RunConfig) -> IterationMetrics:
        state, algo = self.state, cfg.algorithm
        started = workflow.now()
        groups = await self._get_batch(algo)
        batch_ready = workflow.now()
        for group in groups:
            state.domain_mix.observe(group.completed[0].domain,
                                     [r.reward for r in group.completed])
        self.training = True
        try:
            kept = [r for g in groups for r in g.completed]
            if algo.redundancy:
                for result in kept:
                    state.redundant_kept.add(result)
            train = await workflow.execute_activity(
                Activity.TRAIN_STEP,
                TrainRequest(
                    iteration=state.iteration, version=state.version,
                    store_dir=str(cfg.store_dir), algorithm=algo,
                    temperature=cfg.sampling.temperature,
                    samples=[TrainSample(trajectory_id=r.trajectory_id, group_id=r.group_id,
                                         reward=r.reward, turns=r.turns, domain=r.domain)
                             for r in kept],
                ),
                result_type=TrainResult, task_queue=pool_queue("train", cfg.trainer.pool),
                start_to_close_timeout=TRAIN_TIMEOUT,
                heartbeat_timeout=timedelta(seconds=cfg.trainer.heartbeat_s),
                retry_policy=RETRY,
            )
            trained = workflow.now()
            updates, missed = await self._update_replicas(
                cfg, UpdateWeightsRequest(version=train.version,
                                          weights_prefix=train.weights_prefix))
            lags = Counter(state.version - g.start_version for g in groups for _ in g.completed)
            state.version = train.version
            decision = state.buffer.evict_stale(state.version)
            await self._cancel(decision.cancel)
        finally:
            self.training = False
        updated = workflow.now()
        metrics = self._metrics(groups, train, lags, started, batch_ready, trained, updated)
        metrics.replicas = {u.replica: u.metrics for u in updates}
        metrics.missed_updates = missed
        metrics.weight_push_s = train.push_s
        metrics.weight_pull_s = _mean([u.pull_s for u in updates])
        metrics.weight_exposed_s = _mean([u.seconds for u in updates])
        metrics.weight_bytes = train.weight_bytes + sum(u.bytes for u in updates)
        metrics.profile = self._profile(cfg, [r for g in groups for r in g.completed])
        return metrics

    def _profile(self, cfg: RunConfig, results: list[TrajectoryResult]) -> ProfileMetrics | None:
        """Feed the profiler this batch; follow its recommendation when routing.remap allows.
        None when no domain may use more than one pool."""
        state, routing = self.state, cfg.routing
        choices = {name: sorted((p.name for p in cfg.gen_pools(domain)),
                                key=lambda p, name=name: p != state.mapping.get(name, p))
                   for name, domain in cfg.domains.items()}
        if all(len(pools) == 1 for pools in choices.values()):
            return None
        state.profiler.observe(results)
        hardware = cfg.simulation.hardware
        accelerators = {
            p.name: Accelerator(replicas=p.replicas,
                                dense_tflops=getattr(hardware.get(p.hardware), "dense_tflops",
                                                     None),
                                memory_tb_s=getattr(hardware.get(p.hardware), "memory_tb_s",
                                                    None))
            for p in cfg.serving_gen_pools()}
        current = {name: pools[0] for name, pools in choices.items()}
        decision = state.profiler.decide(current, choices, accelerators, routing.remap,
                                         routing.remap_margin, routing.remap_patience)
        if decision.remapped:
            moved = {d: p for d, p in decision.recommended.items() if current[d] != p}
            state.mapping.update(moved)
            workflow.logger.warning("profiler: remapped %s (predicted generation %.1f s -> "
                                    "%.1f s per iteration)", moved, decision.predicted_s,
                                    decision.recommended_s)
        return decision

    async def _get_batch(self, algo: AlgorithmConfig) -> list[Group]:
        """A full batch; or, streaming, what is ready once the deadline passed (at least the
        minimum share of a batch)."""
        state, count = self.state, algo.groups_per_batch

        def full() -> bool:
            return bool(state.buffer.next_batch(count, state.version))

        if algo.batch_policy == "blocking":
            await workflow.wait_condition(full)
            return state.buffer.take(count, state.version)
        least = max(1, round(algo.streaming_min_share * count))
        try:
            await workflow.wait_condition(full, timeout=timedelta(seconds=algo.batch_deadline_s))
            return state.buffer.take(count, state.version)
        except builtins.TimeoutError:  # temporalio's TimeoutError is an activity's
            pass
        await workflow.wait_condition(
            lambda: full() or len(state.buffer.ready_groups(count, state.version)) >= least)
        return state.buffer.take(count, state.version, partial=not full())

    def _metrics(self, groups: list[Group], train: TrainResult, lags: Counter, started,
                 batch_ready, trained, updated) -> IterationMetrics:
        kept = [r for g in groups for r in g.completed]
        waited = (batch_ready - started).total_seconds()
        tokens = sum(r.generated_tokens for r in kept)
        step_s = (updated - started).total_seconds()
        return IterationMetrics(
            iteration=self.state.iteration, ended_at=updated, version=self.state.version,
            reward_mean=_mean([r.reward for r in kept]),
            success_rate=_mean([float(r.success) for r in kept]),
            trajectories=len(kept), generated_tokens=tokens,
            rollout_s=waited, train_s=(trained - batch_ready).total_seconds(),
            weight_update_s=(updated - trained).total_seconds(), step_s=step_s,
            tokens_per_s=tokens / step_s if step_s > 0 else 0.0, loss=train.loss,
            trainer_idle_s=waited, lag_histogram=dict(lags),
            lag_mean=_mean([float(lag) for lag in lags.elements()]),
            lag_max=max(lags, default=0), stale_token_share=train.stale_token_share,
            mixed_version_trajectories=sum(r.mixed_versions for r in kept),
            ratio_mean=train.ratio_mean, ratio_max=train.ratio_max,
            kl_estimate=train.kl_estimate, learning=train.learning,
            domains=domain_metrics(kept), rewards=reward_metrics(kept, self.config, step_s),
            failures=self._failures_since_export(),
        )

    def _failures_since_export(self) -> dict[str, int]:
        totals, exported = self.state.failure_totals, self.state.exported_failures
        return {reason: totals[reason] - exported.get(reason, 0) for reason in sorted(totals)
                if totals[reason] > exported.get(reason, 0)}

    async def _cancel(self, trajectory_ids: list[str]) -> None:
        """All at once: one by one, each request waited for a workflow task (measured: 49
        cancels at the end of a run took 11 s). Runs started before this change replay one by
        one. A batch's trajectories are dropped from it by one signal per batch."""
        in_parallel = workflow.patched(CANCEL_IN_PARALLEL)
        in_batches: dict[str, list[str]] = {}
        batch_of = self.state.batch_of
        if any(tid in batch_of for tid in trajectory_ids) and workflow.patched(DROP_FROM_BATCHES):
            for tid in trajectory_ids:
                if tid in batch_of:
                    in_batches.setdefault(batch_of[tid], []).append(tid)
            trajectory_ids = [tid for tid in trajectory_ids if tid not in batch_of]
        if in_parallel:
            await asyncio.gather(*(self._cancel_one(tid) for tid in trajectory_ids),
                                 *(self._drop(batch, tids) for batch, tids in
                                   in_batches.items()))
            return
        for tid in trajectory_ids:
            await self._cancel_one(tid)

    async def _drop(self, batch_id: str, trajectory_ids: list[str]) -> None:
        try:
            await workflow.get_external_workflow_handle(batch_id).signal(DROP_SIGNAL,
                                                                        trajectory_ids)
        except Exception:  # it ended before the signal arrived; its reports are accounted
            workflow.logger.info("drop from %s found it ended", batch_id)

    async def _cancel_one(self, trajectory_id: str) -> None:
        try:
            await workflow.get_external_workflow_handle(trajectory_id).cancel()
        except Exception:  # it ended before the request arrived; it is accounted already
            workflow.logger.info("cancel of %s found it ended", trajectory_id)

    async def _update_replicas(self, cfg: RunConfig, request: UpdateWeightsRequest,
                               pickup: timedelta | None = None,
                               ) -> tuple[list[UpdateWeightsResult], list[str]]:
        """Suspend -> update -> resume on every replica any domain may route to. A replica with
        no live worker misses the update (and is listed); it loads the newest published version
        when its worker starts again. With no live replica at all the run waits for one (up to
        REPLICA_WAIT), since rollout cannot go on without. That wait is counted in rounds, not
        by the clock: a round under way when the whole stack stopped ends, on `--resume`, as
        long after it began as the stack was down, and must not fail the run unheard."""
        queues = [replica_queue("gen", pool.name, k) for pool in cfg.serving_gen_pools()
                  for k in range(pool.replicas)]
        deadline = workflow.now() + REPLICA_WAIT
        rounds = replica_wait_rounds(pickup or timedelta(seconds=cfg.routing.schedule_to_start_s))
        in_rounds = workflow.patched(REPLICA_WAIT_IN_ROUNDS)
        for attempt in itertools.count(1):
            updated, missed = await self._update_round(cfg, request, queues, pickup)
            if updated:
                return updated, missed
            if attempt >= rounds if in_rounds else workflow.now() > deadline:
                raise ApplicationError(f"no generation replica took weights v{request.version} "
                                       f"in {attempt} rounds (about {REPLICA_WAIT}): none of "
                                       f"{queues} has a live worker",
                                       type="NoReplicas")
            workflow.logger.warning("no live generation replica for v%d; waiting",
                                    request.version)
            await workflow.sleep(REPLICA_RETRY)

    async def _update_round(self, cfg: RunConfig, request: UpdateWeightsRequest,
                            queues: list[str], pickup: timedelta | None,
                            ) -> tuple[list[UpdateWeightsResult], list[str]]:
        outcomes = await asyncio.gather(*(
            workflow.execute_activity(
                Activity.GEN_UPDATE_WEIGHTS, request, result_type=UpdateWeightsResult,
                task_queue=admin_queue(queue),
                schedule_to_start_timeout=pickup or timedelta(
                    seconds=cfg.routing.schedule_to_start_s),
                start_to_close_timeout=UPDATE_TIMEOUT, heartbeat_timeout=UPDATE_HEARTBEAT,
                retry_policy=RETRY,
            )
            for queue in queues
        ), return_exceptions=True)
        updated, missed = [], []
        for queue, outcome in zip(queues, outcomes, strict=True):
            if isinstance(outcome, ActivityError) and isinstance(outcome.cause, TimeoutError):
                workflow.logger.warning("replica %s took no weight update to v%d: no live worker",
                                        queue, request.version)
                missed.append(queue)
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                updated.append(outcome)
        return updated, missed


def replica_wait_rounds(pickup: timedelta) -> int:
    """Update rounds to try before no live replica fails the run: REPLICA_WAIT's worth of
    rounds that each wait `pickup` for a worker, then REPLICA_RETRY; at least two, so that a
    round cut short by a stopped stack is never the only one."""
    return max(2, math.ceil(REPLICA_WAIT / (pickup + REPLICA_RETRY)))


def domain_metrics(results: list[TrajectoryResult]) -> dict[str, DomainMetrics]:
    by_domain: dict[str, list[TrajectoryResult]] = {}
    for result in results:
        by_domain.setdefault(result.domain, []).append(result)
    steps = {name: step_means(rs) for name, rs in by_domain.items()}
    return {
        name: DomainMetrics(
            trajectories=len(rs), success_rate=_mean([float(r.success) for r in rs]),
            reward_mean=_mean([r.reward for r in rs]),
            generated_tokens=sum(r.generated_tokens for r in rs),
            turns_mean=_mean([float(r.turns) for r in rs]),
            cache_hit_rate=(sum(r.cached_tokens for r in rs)
                            / max(sum(r.prompt_tokens for r in rs), 1)),
            fallback_turns=sum(r.fallback_turns for r in rs),
            rerouted_turns=sum(r.rerouted_turns for r in rs),
            env_step_s_p50=quantile(steps[name], 0.5),
            env_step_s_p99=quantile(steps[name], 0.99),
        )
        for name, rs in sorted(by_domain.items())
    }


def trace_iteration(metrics: IterationMetrics) -> None:
    """A span of the iteration under the run's (the tracing interceptor's workflow spans last
    no time: this one carries the iteration's figures)."""
    traced_workflow.completed_span("rollart.iteration", attributes={
        "rollart.iteration": metrics.iteration, "rollart.version": metrics.version,
        "rollart.step_s": metrics.step_s, "rollart.rollout_s": metrics.rollout_s,
        "rollart.train_s": metrics.train_s, "rollart.weight_update_s": metrics.weight_update_s,
        "rollart.success_rate": metrics.success_rate, "rollart.trajectories": metrics.trajectories})


def reward_metrics(results: list[TrajectoryResult], cfg: RunConfig,
                   window_s: float) -> dict[str, RewardMetrics]:
    by_kind: dict[str, list[TrajectoryResult]] = {}
    for result in results:
        if result.reward_kind:
            by_kind.setdefault(result.reward_kind, []).append(result)
    window_s = max(window_s, 1e-9)
    metrics = {}
    for kind, rs in sorted(by_kind.items()):
        pools = {cfg.domains[r.domain].reward_pool for r in rs if r.domain in cfg.domains}
        slots = sum(cfg.pool("reward", name).slots() for name in pools) or 1
        latencies = [r.reward_latency_s for r in rs]
        overheads = [r.reward_compute_s - r.reward_remote_s for r in rs if r.reward_remote_s > 0]
        metrics[kind] = RewardMetrics(
            trajectories=len(rs), latency_s_p50=quantile(latencies, 0.5),
            latency_s_p99=quantile(latencies, 0.99),
            queue_s_p99=quantile([r.reward_queue_s for r in rs], 0.99),
            queue_depth_mean=sum(r.reward_queue_s for r in rs) / window_s,
            busy_share=sum(r.reward_compute_s for r in rs) / (window_s * slots),
            remote_overhead_s_p99=quantile(overheads, 0.99))
    return metrics


def step_means(results: list[TrajectoryResult]) -> list[float]:
    """Each trajectory's mean env step time (those that timed their steps)."""
    return [r.env_step_s / r.turns for r in results if r.turns and r.env_step_s > 0]


def quantile(values: list[float], q: float) -> float:
    """Nearest rank: the smallest value with at least a share q of them at or below it."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(math.ceil(q * len(ordered)) - 1, 0)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0
