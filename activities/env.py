"""Environment activities: reset, step and close of text environments held by an env worker.

An env's state lives in the worker that reset it, so reset answers with that worker's own queue
and the trajectory sends every later step there. Environment code is synchronous and may block,
so these are thread-pool activities.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import math
import random
import threading
import time
from collections import OrderedDict
from datetime import UTC, datetime

from opentelemetry import trace
from temporalio import activity
from temporalio.exceptions import ApplicationError

from rollart.activities.heartbeat import heartbeating_thread
from rollart.config import InjectedFaults
from rollart.contracts import (
    Activity,
    EnvResetRequest,
    EnvResetResult,
    EnvRestoreRequest,
    EnvStepBatch,
    EnvStepBatchResult,
    EnvStepFailure,
    EnvStepRequest,
    EnvStepResult,
)
from rollart.envs import Env, make_env, registered_envs
from rollart.envs.base import UnknownEnvironmentError
from rollart.metrics import ENV_SECONDS, timed

TRACER = trace.get_tracer("rollart")
ENDED_KEPT = 4096
BATCH_THREADS = 64  # a batch activity's steps at once: mostly waiting on env latency


class EnvActivities:
    def __init__(self, worker_queue: str) -> None:
        self.worker_queue = worker_queue
        self.envs: dict[str, Env] = {}
        # per trajectory: a lock around its env, the latest attempt seen (activity id, attempt)
        # and the last step taken (activity id, result)
        self.env_locks: dict[str, threading.Lock] = {}
        self.attempts: dict[str, tuple[str, int]] = {}
        self.last_step: dict[str, tuple[str, EnvStepResult]] = {}
        self.domains: dict[str, str] = {}  # per trajectory, for the latency metric's label
        self._lock = threading.Lock()
        # the last step of the episodes that ended last: a retry of it gets its result (or
        # the env's error again, where the env raised)
        self.ended_steps: OrderedDict[
            str, tuple[str | None, EnvStepResult | ApplicationError]] = OrderedDict()
        self._batch_pool: concurrent.futures.ThreadPoolExecutor | None = None

    @activity.defn(name=Activity.ENV_CHECK)
    def check(self, env_name: str, field: str = "env") -> list[str]:
        """Fails the run up front, naming the config field, when this pool's workers do not know
        the environment."""
        if env_name not in registered_envs():
            raise ApplicationError(
                f"{field}: unknown environment {env_name!r} on {self.worker_queue}; registered: "
                f"{registered_envs()} (an env from a plugin needs it in `plugins`)",
                type="UnknownEnvironment", non_retryable=True,
            )
        return registered_envs()

    @activity.defn(name=Activity.ENV_RESET)
    def reset(self, request: EnvResetRequest) -> EnvResetResult:
        span = TRACER.start_as_current_span("rollart.env.reset", attributes={
            "rollart.trajectory_id": request.trajectory_id, "rollart.env": request.env_name})
        labels = {"op": "reset", "domain": request.domain or request.env_name}
        with heartbeating_thread(), span, timed(ENV_SECONDS, labels):
            return self._reset(request)

    def _reset(self, request: EnvResetRequest) -> EnvResetResult:
        faults = request.faults
        if random.random() < faults.slow_reset_share:
            time.sleep(faults.slow_reset_s)
        if random.random() < faults.reset_failure_rate:
            raise ApplicationError("injected transient reset failure", type="InjectedFault")
        env, observation = self._open(request)
        return self._hold(request, env, observation)

    @activity.defn(name=Activity.ENV_RESTORE)
    def restore(self, request: EnvRestoreRequest) -> EnvResetResult:
        """The same episode on this worker after its own worker died: reset with its seed and
        replay its actions, so the next step continues where it was."""
        with heartbeating_thread():
            return self._restore(request)

    def _restore(self, request: EnvRestoreRequest) -> EnvResetResult:
        env, observation = self._open(request)
        if not getattr(env, "deterministic", False):
            raise ApplicationError(f"environment {request.env_name!r} does not declare "
                                   "deterministic = True: its episode cannot be rebuilt",
                                   type="NotRestorable", non_retryable=True)
        for turn, action in enumerate(request.actions):
            result = env.step(action)
            if result.terminated or result.truncated:
                raise ApplicationError(
                    f"replaying {request.trajectory_id}: the episode ended at turn {turn} of "
                    f"{len(request.actions)} (the env is not deterministic after all)",
                    type="NotRestorable", non_retryable=True)
            observation = result.observation
        return self._hold(request, env, observation)

    def _open(self, request: EnvResetRequest) -> tuple[Env, str]:
        try:
            env = make_env(request.env_name, **request.env_kwargs)
        except UnknownEnvironmentError as err:
            raise ApplicationError(str(err), type="UnknownEnvironment", non_retryable=True) from err
        except TypeError as err:
            raise ApplicationError(f"env.kwargs: {err}", type="BadEnvConfig",
                                   non_retryable=True) from err
        observation, _ = env.reset(request.seed)
        _check_size(observation, request.max_observation_chars, "reset")
        return env, observation

    def _hold(self, request: EnvResetRequest, env: Env, observation: str) -> EnvResetResult:
        trajectory_id = request.trajectory_id
        with self._lock:
            self.envs[trajectory_id] = env
            self.domains[trajectory_id] = request.domain or request.env_name
            self.env_locks[trajectory_id] = threading.Lock()
            self.last_step.pop(trajectory_id, None)
        return EnvResetResult(observation=observation, worker_queue=self.worker_queue,
                              action_vocabulary=getattr(env, "action_vocabulary", None),
                              answer_alphabet=getattr(env, "answer_alphabet", None),
                              answer_length=getattr(env, "answer_length", None),
                              deterministic=bool(getattr(env, "deterministic", False)))

    @activity.defn(name=Activity.ENV_STEP)
    def step(self, request: EnvStepRequest) -> EnvStepResult:
        """Exactly once per step. An attempt that timed out but still runs (hung, or starved of
        CPU) does not step once its retry has started, and whichever of them steps first, the
        other gets that result instead of stepping again (they share the step's activity id)."""
        with heartbeating_thread():
            return self._observed_step(request)

    @activity.defn(name=Activity.ENV_STEP_BATCH)
    def step_batch(self, batch: EnvStepBatch) -> EnvStepBatchResult:
        """Every step of a lockstep batch's turn held by this worker, at once (their latencies
        overlap as separate activities' would). Exactly once per step as `step` is: a retried
        batch takes again only the steps its failed attempt did not. A non-retryable failure
        (the env raised) is that step's alone; a retryable one fails the attempt, except on the
        batch's last attempt, where it and any step still running near the deadline are
        answered as that step's failure."""
        isolating = batch.attempts > 0
        last = isolating and activity.in_activity() and activity.info().attempt >= batch.attempts
        with heartbeating_thread():
            futures = [self._batch_threads().submit(contextvars.copy_context().run,
                                                    self._observed_step, request, str(index))
                       for index, request in enumerate(batch.steps)]
            concurrent.futures.wait(futures, timeout=_time_left_s(margin=True) if last else None)
        results: list[EnvStepResult | None] = []
        failures: list[EnvStepFailure | None] = []
        for future in futures:
            error = future.exception() if future.done() else None
            if future.done() and error is None:
                results.append(future.result())
                failures.append(None)
                continue
            if error is not None and not (
                    last or (isolating and getattr(error, "non_retryable", False))):
                raise error
            if error is None:
                error = ApplicationError("env step did not finish before the batch's deadline",
                                         type="EnvStepTimeout")
            results.append(None)
            failures.append(EnvStepFailure(
                type=getattr(error, "type", None) or type(error).__name__, message=str(error)))
        return EnvStepBatchResult(results=results,
                                  failures=failures if any(failures) else [])

    def _batch_threads(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._batch_pool is None:
                self._batch_pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=BATCH_THREADS, thread_name_prefix="env-batch")
            return self._batch_pool

    def _observed_step(self, request: EnvStepRequest, part: str | None = None) -> EnvStepResult:
        with TRACER.start_as_current_span("rollart.env.step", attributes={
                "rollart.trajectory_id": request.trajectory_id}):
            domain = self.domains.get(request.trajectory_id, "")
            with timed(ENV_SECONDS, {"op": "step", "domain": domain}):
                return self._step(request, part)

    def _step(self, request: EnvStepRequest, part: str | None = None) -> EnvStepResult:
        """`part`: the step's place in a batch activity, which makes its id within the
        activity's."""
        started = time.perf_counter()
        tid = request.trajectory_id
        step_id, attempt = None, ("direct", 0)
        if activity.in_activity():
            info = activity.info()
            step_id = info.activity_id if part is None else f"{info.activity_id}/{part}"
            attempt = (step_id, info.attempt)
        with self._lock:
            env, env_lock = self.envs.get(tid), self.env_locks.get(tid)
            self.attempts[tid] = attempt
            last = self.ended_steps.get(tid) if env is None else None
        if last is not None and step_id is not None and last[0] == step_id:
            if isinstance(last[1], ApplicationError):  # the episode ended on this very step,
                raise last[1]  # in an earlier attempt
            return last[1]
        if env is None:
            raise ApplicationError(
                f"no live environment for {tid} on {self.worker_queue} "
                "(the env worker restarted?)", type="EnvironmentLost", non_retryable=True,
            )
        self._inject(request)
        with self._lock:
            superseded = (self.attempts.get(tid) != attempt or self.envs.get(tid) is not env
                          or _past_deadline())
        if superseded:  # retried, timed out or the episode ended while this attempt was held up
            raise ApplicationError("env step attempt superseded", type="StepSuperseded")
        with env_lock:
            done = self.last_step.get(tid)
            if step_id is not None and done is not None and done[0] == step_id:
                return done[1]
            try:
                result = env.step(request.action)
            except Exception as err:
                # A step may have changed the env before raising: retrying it would not be the
                # same step, so the trajectory fails with the env's own error.
                self.close(tid)
                failure = ApplicationError(f"{type(err).__name__}: {err}",
                                           type="EnvironmentError", non_retryable=True)
                self._ended(tid, step_id, failure)
                raise failure from err
            _check_size(result.observation, request.max_observation_chars, "step")
            out = EnvStepResult(observation=result.observation, reward=result.reward,
                                terminated=result.terminated, truncated=result.truncated,
                                info=result.info,
                                seconds=round(time.perf_counter() - started, 6))
            self.last_step[tid] = (step_id, out)
        if result.terminated or result.truncated:
            self.close(tid)
            self._ended(tid, step_id, out)
        return out

    def _ended(self, tid: str, step_id: str | None,
               outcome: EnvStepResult | ApplicationError) -> None:
        with self._lock:
            self.ended_steps[tid] = (step_id, outcome)
            while len(self.ended_steps) > ENDED_KEPT:
                self.ended_steps.popitem(last=False)

    def _inject(self, request: EnvStepRequest) -> None:
        """Synthetic latency, transient failures and hangs, all before the env is touched."""
        faults = request.faults or InjectedFaults()
        if faults.step_median_s > 0:
            time.sleep(random.lognormvariate(math.log(faults.step_median_s), faults.step_sigma))
        if faults.step_mean_s > 0:
            time.sleep(max(random.gauss(faults.step_mean_s, faults.step_std_s), 0.0))
        if random.random() < faults.step_failure_rate:
            raise ApplicationError("injected transient env failure", type="InjectedFault")
        if random.random() < faults.step_hang_rate:
            time.sleep(faults.hang_s)

    @activity.defn(name=Activity.ENV_CLOSE)
    def close(self, trajectory_id: str) -> None:
        with self._lock:
            env = self.envs.pop(trajectory_id, None)
            self.env_locks.pop(trajectory_id, None)
            self.last_step.pop(trajectory_id, None)
            self.attempts.pop(trajectory_id, None)
            self.domains.pop(trajectory_id, None)
        closer = getattr(env, "close", None)
        if closer is not None:
            closer()


def _time_left_s(margin: bool = False) -> float | None:
    """Seconds until this attempt's start-to-close deadline (None without one); with `margin`,
    less a tenth of the timeout (at most 1 s), time to answer before the server gives up."""
    if not activity.in_activity():
        return None
    info = activity.info()
    if info.start_to_close_timeout is None or info.started_time is None:
        return None
    timeout = info.start_to_close_timeout.total_seconds()
    left = (info.started_time - datetime.now(UTC)).total_seconds() + timeout
    return max(left - (min(timeout / 10, 1.0) if margin else 0.0), 0.0)


def _past_deadline() -> bool:
    """Whether this attempt has outlived its start-to-close timeout: the server has failed it
    already, and its trajectory may be failed and its env about to be released."""
    left = _time_left_s()
    return left is not None and left <= 0


def _check_size(observation: str, limit: int, where: str) -> None:
    if len(observation) > limit:
        raise ApplicationError(
            f"the env's {where} returned an observation of {len(observation)} characters, over "
            f"domains.<name>.max_observation_chars ({limit})", type="ObservationTooLarge",
            non_retryable=True)
