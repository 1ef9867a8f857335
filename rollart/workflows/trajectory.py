"""TrajectoryWorkflow: one agent episode, reset -> (generate -> step)* -> reward.

Each step is an activity on the queue of the fleet that owns it, so a slow or failing environment
delays or fails only its own trajectory. The result is a reference (the trajectory id plus a few
scalars); the tokens stay in the trajectory store.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError

with workflow.unsafe.imports_passed_through():
    from rollart.contracts import (
        EnvResetRequest,
        EnvResetResult,
        EnvStepRequest,
        EnvStepResult,
        GenerateRequest,
        GenerateResult,
        RewardRequest,
        RewardResult,
        TrajectoryResult,
        TrajectorySpec,
    )

ENV_TIMEOUT = timedelta(seconds=60)
GENERATE_TIMEOUT = timedelta(seconds=120)
REWARD_TIMEOUT = timedelta(seconds=60)
ENV_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                        maximum_attempts=3)
GENERATE_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                             maximum_attempts=5)
CONTEXT_FULL = "context_full"


@workflow.defn
class TrajectoryWorkflow:
    def __init__(self) -> None:
        self.turn = 0
        self.phase = "reset"

    @workflow.query
    def progress(self) -> dict[str, object]:
        return {"turn": self.turn, "phase": self.phase}

    @workflow.run
    async def run(self, spec: TrajectorySpec) -> TrajectoryResult:
        tid = spec.trajectory_id
        try:
            return await self._episode(spec)
        except ActivityError as err:
            cause = err.cause.message if err.cause is not None else str(err)
            raise ApplicationError(
                f"trajectory {tid} failed in {self.phase} (turn {self.turn}): {cause}",
                type="TrajectoryFailed",
                non_retryable=True,
            ) from err

    async def _episode(self, spec: TrajectorySpec) -> TrajectoryResult:
        tid = spec.trajectory_id
        reset = await workflow.execute_activity(
            "env.reset",
            EnvResetRequest(trajectory_id=tid, env_name=spec.env_name,
                            env_kwargs=spec.env_kwargs, seed=spec.seed),
            result_type=EnvResetResult, task_queue=spec.env_queue,
            start_to_close_timeout=ENV_TIMEOUT, retry_policy=ENV_RETRY,
        )
        observation, rewards, info = reset.observation, [], {}
        generated, versions, ended = 0, [], False
        try:
            for self.turn in range(spec.max_turns):
                self.phase = "generate"
                gen = await workflow.execute_activity(
                    "gen.generate",
                    GenerateRequest(trajectory_id=tid, turn=self.turn, observation=observation,
                                    store_dir=spec.store_dir, sampling=spec.sampling,
                                    action_vocabulary=reset.action_vocabulary),
                    result_type=GenerateResult, task_queue=spec.gen_queue,
                    start_to_close_timeout=GENERATE_TIMEOUT, retry_policy=GENERATE_RETRY,
                )
                if gen.finish_reason == CONTEXT_FULL:
                    break
                generated += gen.new_tokens
                versions.append(gen.version)
                self.phase = "step"
                step = await workflow.execute_activity(
                    "env.step", EnvStepRequest(trajectory_id=tid, action=gen.text),
                    result_type=EnvStepResult, task_queue=reset.worker_queue,
                    start_to_close_timeout=ENV_TIMEOUT, retry_policy=ENV_RETRY,
                )
                observation, info = step.observation, step.info
                rewards.append(step.reward)
                if step.terminated or step.truncated:
                    ended = True
                    break
        finally:
            if not ended:  # the env worker frees ended episodes itself
                await workflow.execute_activity(
                    "env.close", tid, task_queue=reset.worker_queue,
                    start_to_close_timeout=ENV_TIMEOUT, retry_policy=ENV_RETRY,
                )
        self.phase = "reward"
        reward = await workflow.execute_activity(
            "reward.compute",
            RewardRequest(trajectory_id=tid, env_name=spec.env_name, env_rewards=rewards,
                          final_info=info),
            result_type=RewardResult, task_queue=spec.reward_queue,
            start_to_close_timeout=REWARD_TIMEOUT, retry_policy=ENV_RETRY,
        )
        self.phase = "done"
        return TrajectoryResult(
            trajectory_id=tid, group_id=spec.group_id, status="completed",
            reward=reward.reward, success=reward.success, turns=len(versions),
            generated_tokens=generated,
            start_version=min(versions, default=-1), end_version=max(versions, default=-1),
        )
