"""Fleet workers: one process per (role, pool, replica) polling its task queues and hosting the
heavy object of its role (env instances, a vLLM engine, the trainer)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import logging
import os
import socket
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollart import search_attributes
from rollart.config import RunConfig
from rollart.queues import admin_queue, pool_queue, replica_queue
from rollart.workers.client import connect
from rollart.workers.telemetry import (
    start_metrics,
    start_tracing,
    stop_metrics,
    temporal_interceptors,
)

log = logging.getLogger("rollart.worker")
# Named, not left to the SDK: its default hashes the bytecode of every loaded module, 2-5 s of
# CPU in a worker that imported torch and vLLM (versioning is off: the id only labels pollers).
BUILD_ID = f"rollart-{importlib.metadata.version('rollart')}"
WORKER_SLOT_ENV = "ROLLART_WORKER_SLOT"  # set by the supervisor: a name stable across restarts
WorkerRole = Literal["control", "env", "gen", "reward", "train"]


async def run_worker(config: RunConfig, role: WorkerRole, pool: str = "cpu",
                     replica: int = 0, ready: asyncio.Event | None = None) -> None:
    """Serve one role until cancelled."""
    if role != "control" and (role, pool) not in {(p.role, p.name) for p in config.pools}:
        raise ValueError(f"--pool: no {role} pool named {pool!r} in the config")
    if role == "gen" and not 0 <= replica < config.pool("gen", pool).replicas:
        raise ValueError(f"--replica: gen pool {pool!r} declares "
                         f"{config.pool('gen', pool).replicas} replicas (0..n-1), got {replica}")
    stop_tracing = start_tracing(config, f"rollart-{role}")
    name = worker_name(config, role, pool, replica)
    client = await connect(config.temporal, temporal_interceptors(config),
                           start_metrics(config, name, role))
    closers: list = [lambda: stop_metrics(config, name)]
    try:
        workers = await build_workers(config, client, role, pool, replica, closers)
        log.info("%s worker up: %s", role, ", ".join(w.task_queue for w in workers))
        async with _all(workers):
            if ready is not None:
                ready.set()
            await asyncio.Event().wait()
    finally:
        for close in closers:
            close()
        stop_tracing()  # last: flushes the spans of everything above


def worker_name(config: RunConfig, role: WorkerRole, pool: str, replica: int) -> str:
    """The stack's name for this worker (e.g. gen.cpu.r0), else one of its own."""
    slot = os.environ.get(WORKER_SLOT_ENV)
    prefix = f"{Path(config.run_dir).name}."
    if slot:
        return slot.removeprefix(prefix)
    if role == "control":
        return f"control.{os.getpid()}"
    return f"{role}.{pool}.r{replica}.{os.getpid()}"


@contextlib.asynccontextmanager
async def in_process_fleet(config: RunConfig, engine=None,
                           roles: tuple[WorkerRole, ...] = ("control", "env", "reward", "gen",
                                                            "train")):
    """Workers for every declared pool (and gen replica) of these roles inside this process and
    event loop (tests and benchmarks), gen replicas sharing `engine` when one is given; yields the
    client."""
    stop_tracing = start_tracing(config, "rollart")
    client = await connect(config.temporal, temporal_interceptors(config),
                           start_metrics(config, "in-process", "all"))
    closers: list = [lambda: stop_metrics(config, "in-process")]
    workers = []
    try:
        for role in roles:
            if role == "control":
                workers += await build_workers(config, client, role, closers=closers)
                continue
            for pool in (p for p in config.pools if p.role == role):
                for replica in range(pool.replicas if role in ("gen", "reward") else 1):
                    workers += await build_workers(config, client, role, pool.name, replica,
                                                   closers=closers, engine=engine)
        async with _all(workers):
            yield client
    finally:
        for close in closers:
            close()
        stop_tracing()  # last: flushes the spans of everything above


_BACKENDS: dict[str, tuple] = {}


def _weight_backends(config: RunConfig, closers: list, lend: bool) -> tuple:
    """One (primary, durable) pair of weight backends per process, run location and role (a
    publisher lends memory to the Mooncake store, a replica does not)."""
    from rollart.weights import open_backends

    key = f"{config.weights.model_dump_json()}|{config.weights_url}|{lend}"
    if key not in _BACKENDS:
        _BACKENDS[key] = backends = open_backends(config, lend)

        def close() -> None:
            _BACKENDS.pop(key, None)
            for backend in backends:
                if backend is not None:
                    backend.close()

        closers.append(close)
    return _BACKENDS[key]


class _all:  # enter and exit several workers as one
    def __init__(self, workers: list[Worker]) -> None:
        self.workers = workers

    async def __aenter__(self) -> None:
        for worker in self.workers:
            await worker.__aenter__()

    async def __aexit__(self, *exc) -> None:
        for worker in reversed(self.workers):
            await worker.__aexit__(*exc)


async def _serve_judge(config: RunConfig, pool: str, closers: list, device=None) -> None:
    """Start one judge engine for the reward pool and serve this process's `model` rewards
    on it; in simulated compute, on `device` when it shares a gen replica's."""
    from rollart.activities.reward_model import JUDGE
    from rollart.policy.model import policy_model_path, resolve_model_path

    spec = config.pool("reward", pool)
    path = (policy_model_path(config) if spec.model == "policy"
            else resolve_model_path(spec.model, config.model.seed))
    if config.simulation.enabled:
        from rollart.simulation.engine import SimulatedEngine

        hardware = (config.pool("gen", spec.colocate_with).hardware if spec.colocate_with
                    else spec.hardware)
        engine = SimulatedEngine(path, config.engine, config.simulation, hardware,
                                 seed=config.model.seed, device=device)
    else:
        from rollart.policy.engine import PolicyEngine

        engine = PolicyEngine(path, config.engine, seed=config.model.seed)
    closers.append(engine.shutdown)
    await engine.start()
    closers.append(JUDGE.add_engine(engine, asyncio.get_running_loop()))
    log.info("reward judge %s serving for pool %s", path, pool)


_REWARD_QUEUES_SERVED: set[tuple[int, str]] = set()


def _reward_workers(config: RunConfig, client, pool: str, closers: list) -> list[Worker]:
    """The pool's reward Worker, unless this process serves its queue already (a client may
    have one Worker per queue: several judge engines in one process share it)."""
    from rollart.activities.reward import check_reward, compute_reward

    served = (id(client), pool_queue("reward", pool))
    if served in _REWARD_QUEUES_SERVED:
        return []
    _REWARD_QUEUES_SERVED.add(served)
    closers.append(lambda: _REWARD_QUEUES_SERVED.discard(served))
    slots = config.pool("reward", pool).worker_slots()
    return [Worker(client, build_id=BUILD_ID, task_queue=pool_queue("reward", pool),
                   activities=[check_reward, compute_reward],
                   activity_executor=ThreadPoolExecutor(max_workers=slots),
                   max_concurrent_activities=slots)]


async def build_workers(config: RunConfig, client, role: WorkerRole, pool: str = "cpu",
                        replica: int = 0, closers: list | None = None,
                        engine=None) -> list[Worker]:
    """The temporalio Workers one process of this role runs; `engine` reuses a started one."""
    closers = [] if closers is None else closers
    if role == "control":
        from rollart.activities.route import RouterActivities
        from rollart.workflows.batch_rollout import BatchRolloutWorkflow
        from rollart.workflows.training import TrainingWorkflow
        from rollart.workflows.trajectory import TrajectoryWorkflow

        if config.temporal.search_attributes:
            await search_attributes.register(client, config.temporal.namespace)
        router = RouterActivities()
        runner = {} if config.temporal.workflow_sandbox else {
            "workflow_runner": UnsandboxedWorkflowRunner()}
        return [Worker(client, build_id=BUILD_ID, task_queue=config.temporal.control_queue,
                       workflows=[TrainingWorkflow, TrajectoryWorkflow, BatchRolloutWorkflow],
                       activities=[router.route, router.release], **runner)]
    if role in ("env", "reward"):
        from rollart.envs import load_plugins

        load_plugins(config.plugins)
    if role == "env":
        from rollart.activities.env import EnvActivities

        # Under a supervisor the slot outlives the process: steps sent to a restarted worker's
        # queue are answered (EnvironmentLost, rebuilt elsewhere) instead of waiting pickup_s.
        slot = os.environ.get(WORKER_SLOT_ENV)
        worker_id = f"{socket.gethostname()}-" + (
            slot or f"{os.getpid()}-{uuid.uuid4().hex[:6]}")
        own_queue = f"{pool_queue('env', pool)}.{worker_id}"
        envs = EnvActivities(own_queue)
        slots = config.pool("env", pool).worker_slots()
        executor = ThreadPoolExecutor(max_workers=slots)
        activities = [envs.check, envs.reset, envs.restore, envs.step, envs.step_batch,
                      envs.close]
        return [Worker(client, build_id=BUILD_ID, task_queue=queue, activities=activities,
                       activity_executor=executor, max_concurrent_activities=slots)
                for queue in (pool_queue("env", pool), own_queue)]
    if role == "reward":
        spec = config.pool("reward", pool)
        if spec.colocate_with is not None:
            return []  # served by the gen workers of the pool it is colocated with
        if spec.model is not None:
            await _serve_judge(config, pool, closers)
        return _reward_workers(config, client, pool, closers)
    if role == "gen":
        from rollart.activities.generate import GenerateActivities
        from rollart.policy.engine import PolicyEngine
        from rollart.policy.model import policy_model_path
        from rollart.store import StoreOpener
        from rollart.weights import Puller

        queue = replica_queue("gen", pool, replica)
        model_path = policy_model_path(config)
        if engine is not None:
            gen_engine = engine
        elif config.simulation.enabled:
            from rollart.simulation.engine import SimulatedEngine

            gen_engine = SimulatedEngine(model_path, config.engine, config.simulation,
                                         config.pool("gen", pool).hardware,
                                         seed=config.model.seed + replica)
        else:
            spec = config.pool("gen", pool)
            gen_engine = PolicyEngine(model_path, config.engine, seed=config.model.seed + replica,
                                      speculation=spec.speculation,
                                      tensor_parallel_size=spec.tensor_parallel_size)
        if engine is None:
            closers.append(gen_engine.shutdown)
            # before the weight backends open: a forked engine core inherits none of them
            await gen_engine.start()
        puller = Puller(*_weight_backends(config, closers, lend=False))
        gen = GenerateActivities(gen_engine, puller, queue, StoreOpener(config.storage))
        if engine is None:
            version = await gen.catch_up(config.weights_prefix)
            log.info("%s serves policy version %d", queue, version)
        workers = [Worker(client, build_id=BUILD_ID, task_queue=queue,
                          activities=[gen.generate, gen.generate_batch],
                          max_concurrent_activities=config.engine.max_num_seqs),
                   Worker(client, build_id=BUILD_ID, task_queue=admin_queue(queue),
                          activities=[gen.ping, gen.update_weights], max_concurrent_activities=4)]
        for judged in (p for p in config.pools if p.colocate_with == pool):
            await _serve_judge(config, judged.name, closers, device=gen_engine.device)
            workers += _reward_workers(config, client, judged.name, closers)
        return workers
    if role == "train":
        from rollart.activities.train import TrainActivities
        from rollart.blobs import open_blobs
        from rollart.policy.model import policy_model_path
        from rollart.policy.trainer import Trainer
        from rollart.store import StoreOpener
        from rollart.weights import Publisher, Puller

        model_path = policy_model_path(config)
        if config.simulation.enabled:
            from rollart.simulation.trainer import SimulatedTrainer

            trainer = SimulatedTrainer(model_path, config.simulation, seed=config.model.seed)
        elif config.trainer.backend == "megatron":
            from rollart.policy.megatron import MegatronTrainer

            trainer = MegatronTrainer(model_path, config.algorithm.learning_rate,
                                      seed=config.model.seed, threads=config.trainer.threads,
                                      device=config.trainer.device)
            closers.append(trainer.close)
        elif config.trainer.ranks > 1:
            from rollart.policy.sharded import ShardedTrainer

            trainer = ShardedTrainer(model_path, config.algorithm.learning_rate,
                                     seed=config.model.seed, threads=config.trainer.threads,
                                     device=config.trainer.device, ranks=config.trainer.ranks)
            closers.append(trainer.close)
        else:
            trainer = Trainer(model_path, config.algorithm.learning_rate,
                              seed=config.model.seed, threads=config.trainer.threads,
                              device=config.trainer.device)
        backends = _weight_backends(config, closers, lend=True)
        publisher = Publisher(*backends, config.weights_prefix, config.weights.bucket_mib)
        train = TrainActivities(trainer, publisher, Puller(*backends),
                                open_blobs(config.checkpoint_url, config.storage),
                                config.trainer.checkpoint_every, StoreOpener(config.storage))
        return [Worker(client, build_id=BUILD_ID, task_queue=pool_queue("train", pool),
                       activities=[train.step, train.begin_run],
                       activity_executor=ThreadPoolExecutor(max_workers=1),
                       max_concurrent_activities=1)]
    raise ValueError(f"--role: unknown role {role!r}")
