import time

import envs_for_tests  # noqa: F401  (registers the test environments)
import pytest
from temporalio.exceptions import ApplicationError

from rollart.activities.env import EnvActivities
from rollart.config import InjectedFaults
from rollart.contracts import EnvResetRequest, EnvStepRequest


def test_injected_latency_delays_resets_and_steps():
    envs = EnvActivities("q")
    slow = InjectedFaults(slow_reset_share=1.0, slow_reset_s=0.3, step_median_s=0.1,
                           step_sigma=0.0)
    started = time.perf_counter()
    envs.reset(EnvResetRequest(trajectory_id="t", env_name="frozenlake", seed=0, faults=slow))
    assert time.perf_counter() - started >= 0.3
    started = time.perf_counter()
    envs.step(EnvStepRequest(trajectory_id="t", action="Down", faults=slow))
    assert 0.1 <= time.perf_counter() - started < 0.5


def test_unknown_env_and_lost_env_are_not_retried():
    envs = EnvActivities("q")
    with pytest.raises(ApplicationError) as unknown:
        envs.reset(EnvResetRequest(trajectory_id="t", env_name="nope", seed=0))
    assert unknown.value.non_retryable and "unknown environment 'nope'" in str(unknown.value)
    with pytest.raises(ApplicationError) as lost:
        envs.step(EnvStepRequest(trajectory_id="never-reset", action="Up"))
    assert lost.value.non_retryable and lost.value.type == "EnvironmentLost"


def test_an_ended_episode_frees_its_env():
    envs = EnvActivities("q")
    envs.reset(EnvResetRequest(trajectory_id="t", env_name="frozenlake", seed=0))
    envs.step(EnvStepRequest(trajectory_id="t", action="Right"))
    assert envs.step(EnvStepRequest(trajectory_id="t", action="Down")).terminated  # a hole
    assert envs.envs == {}


def test_a_long_step_heartbeats_and_a_short_one_does_not():
    """A worker that dies mid-step is noticed after the heartbeat timeout, not step_s; steps
    shorter than a third of it send nothing (each heartbeat is a call to the server)."""
    import dataclasses
    from datetime import timedelta

    from temporalio.testing import ActivityEnvironment

    beats: list[tuple] = []
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info,
                                           heartbeat_timeout=timedelta(seconds=0.3),
                                           start_to_close_timeout=None)
    environment.on_heartbeat = lambda *details: beats.append(details)
    envs = EnvActivities("q")
    environment.run(envs.reset, EnvResetRequest(trajectory_id="t", env_name="frozenlake",
                                                seed=0))
    environment.run(envs.step, EnvStepRequest(trajectory_id="t", action="Right"))
    assert beats == []
    slow = InjectedFaults(step_median_s=0.5, step_sigma=0.0)
    environment.run(envs.step, EnvStepRequest(trajectory_id="t", action="Right", faults=slow))
    assert 3 <= len(beats) <= 6  # every 0.1 s for 0.5 s


def test_a_batch_steps_every_env_at_once_and_a_retry_steps_only_what_failed():
    """A lockstep turn's steps share one activity: their latencies overlap, and its retry
    (same activity id, next attempt) takes again only the step that failed."""
    import dataclasses

    from temporalio.testing import ActivityEnvironment

    from rollart.contracts import EnvStepBatch

    envs = EnvActivities("q")
    for tid in ("a", "b", "c"):
        envs.reset(EnvResetRequest(trajectory_id=tid, env_name="frozenlake", seed=0))
    envs.step(EnvStepRequest(trajectory_id="b", action="Right"))  # next to the hole below
    slow = InjectedFaults(step_median_s=0.3, step_sigma=0.0)
    failing = InjectedFaults(step_failure_rate=1.0)
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, activity_id="turn-0",
                                           start_to_close_timeout=None)
    started = time.perf_counter()
    with pytest.raises(ApplicationError) as failed:
        environment.run(envs.step_batch, EnvStepBatch(steps=[
            EnvStepRequest(trajectory_id="a", action="Right", faults=slow),
            EnvStepRequest(trajectory_id="b", action="Down", faults=slow),
            EnvStepRequest(trajectory_id="c", action="Right", faults=failing)]))
    assert failed.value.type == "InjectedFault" and not failed.value.non_retryable
    assert time.perf_counter() - started < 0.55  # two 0.3 s steps at once, not one by one
    environment.info = dataclasses.replace(environment.info, attempt=2)
    retried = environment.run(envs.step_batch, EnvStepBatch(steps=[
        EnvStepRequest(trajectory_id="a", action="Right"),
        EnvStepRequest(trajectory_id="b", action="Down"),
        EnvStepRequest(trajectory_id="c", action="Right")]))
    a, b, c = retried.results
    assert a.seconds >= 0.3  # attempt 1's result: "a" was not stepped twice
    assert b.terminated and "b" not in envs.envs  # fell in a hole on attempt 1, answered again
    assert c.seconds < 0.3 and not c.terminated  # stepped once, now
    moved = envs.step(EnvStepRequest(trajectory_id="a", action="Down"))
    assert moved.terminated  # the hole at (1, 1): "a" moved right exactly once


def test_a_batch_answers_its_failed_steps_one_by_one_on_its_last_attempt():
    """Where the batch isolates failures (attempts > 0): an env that raises fails its own step
    at once; a transient failure is retried until the last attempt; a step still hung near the
    deadline is answered as a timeout; the other steps' results come back."""
    import dataclasses
    from datetime import UTC, datetime, timedelta

    from temporalio.testing import ActivityEnvironment

    from rollart.contracts import EnvStepBatch

    envs = EnvActivities("q")
    envs.reset(EnvResetRequest(trajectory_id="ok", env_name="frozenlake", seed=0))
    envs.reset(EnvResetRequest(trajectory_id="boom", env_name="exploding",
                               env_kwargs={"every": 1}, seed=0))
    for tid in ("flaky", "hung"):
        envs.reset(EnvResetRequest(trajectory_id=tid, env_name="frozenlake", seed=0))
    failing = InjectedFaults(step_failure_rate=1.0)
    hanging = InjectedFaults(step_hang_rate=1.0, hang_s=3.0)

    def batch(hang: bool) -> EnvStepBatch:
        return EnvStepBatch(attempts=2, steps=[
            EnvStepRequest(trajectory_id="ok", action="Right"),
            EnvStepRequest(trajectory_id="boom", action="Right"),
            EnvStepRequest(trajectory_id="flaky", action="Right", faults=failing),
            EnvStepRequest(trajectory_id="hung", action="Right",
                           faults=hanging if hang else None)])

    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(
        environment.info, activity_id="turn-0", started_time=datetime.now(UTC),
        start_to_close_timeout=timedelta(seconds=30))
    with pytest.raises(ApplicationError) as failed:  # attempt 1 of 2: the transient one retries
        environment.run(envs.step_batch, batch(hang=False))
    assert failed.value.type == "InjectedFault"
    environment.info = dataclasses.replace(
        environment.info, attempt=2, started_time=datetime.now(UTC),
        start_to_close_timeout=timedelta(seconds=1.5))
    started = time.perf_counter()
    last = environment.run(envs.step_batch, batch(hang=True))
    assert 1.2 < time.perf_counter() - started < 2.5  # answered before the 1.5 s deadline
    ok, boom, flaky, hung = last.results
    assert ok is not None and not ok.terminated and boom is flaky is hung is None
    assert [f.type if f else None for f in last.failures] == [
        None, "EnvironmentError", "InjectedFault", "EnvStepTimeout"]
    assert "boom: the simulator crashed" in last.failures[1].message  # the env's own error
    assert envs.step(EnvStepRequest(trajectory_id="ok", action="Down")).terminated  # once


def test_a_batch_without_isolation_raises_its_first_non_retryable_failure():

    from rollart.contracts import EnvStepBatch

    envs = EnvActivities("q")
    envs.reset(EnvResetRequest(trajectory_id="ok", env_name="frozenlake", seed=0))
    envs.reset(EnvResetRequest(trajectory_id="boom", env_name="exploding",
                               env_kwargs={"every": 1}, seed=0))
    with pytest.raises(ApplicationError) as failed:
        envs.step_batch(EnvStepBatch(steps=[EnvStepRequest(trajectory_id="ok", action="Right"),
                                            EnvStepRequest(trajectory_id="boom", action="Right")]))
    assert failed.value.type == "EnvironmentError" and failed.value.non_retryable
