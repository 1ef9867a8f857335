import time

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
