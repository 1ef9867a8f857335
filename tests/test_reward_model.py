"""The `model` reward kind: an LLM judge (the tiny model) on a reward worker's own vLLM engine,
scoring by its verdict distribution; whole trajectories scored by a judge worker process."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from conftest import make_config
from temporalio.exceptions import ApplicationError

from rollart.activities.reward_model import ModelJudge
from rollart.config import RewardConfig
from rollart.contracts import RewardRequest, TrajectoryResult, TrajectorySpec
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.asyncio(loop_scope="session")
VERDICTS = {"Right": 1.0, "Left": 0.0}  # words of the tiny model's vocabulary


def judged(prompt: str, **reward) -> RewardRequest:
    return RewardRequest(trajectory_id="t", env_name="frozenlake", env_rewards=[0.0],
                         prompt=prompt, actions=["Down"],
                         reward=RewardConfig(**{"kind": "model", "verdicts": VERDICTS,
                                                **reward}))


async def test_the_judges_reward_is_its_verdict_distributions_expectation(engine):
    judge = ModelJudge()
    judge.add_engine(engine, asyncio.get_running_loop())
    prompts = ["P F F F", "F H F G", "P F H G", "F F F F"] * 4
    results = await asyncio.gather(*(asyncio.to_thread(judge.score, judged(p)) for p in prompts))
    rewards = [r.reward for r in results]
    assert all(0 < r < 1 for r in rewards)
    assert rewards[:4] == pytest.approx(rewards[4:8], abs=1e-6)  # an expectation, not a draw
    assert len({round(r, 6) for r in rewards[:4]}) > 1
    assert [r.success for r in results] == [r >= 0.5 for r in rewards]

    # the expectation is the judge's own sampling distribution over the verdicts
    prompt_ids = engine.encode("P F F F Down correct?")
    allowed = engine.single_token_ids(list(VERDICTS))
    draws = await asyncio.gather(*(engine.generate(prompt_ids, max_tokens=1, temperature=1.0,
                                                   allowed_token_ids=allowed)
                                   for _ in range(400)))
    share = sum(d.token_ids[0] == allowed[0] for d in draws) / len(draws)
    p = rewards[0]
    assert abs(share - p) < 4 * (p * (1 - p) / len(draws)) ** 0.5 + 0.01

    with pytest.raises(ApplicationError, match="reward.verdicts: verdict 'Left Right' is 2"):
        await asyncio.to_thread(judge.score, judged("P F", verdicts={"Left Right": 1, "Up": 0}))
    with pytest.raises(ApplicationError, match="reward.template: cannot fill"):
        await asyncio.to_thread(judge.score, judged("P F", template="{answer}"))


async def test_a_judge_worker_scores_whole_trajectories(temporal_server, engine, tmp_path):
    pools = [{"name": "cpu", "role": r} for r in ("env", "gen", "reward", "train")]
    config = make_config(temporal_server, tmp_path, pools=pools + [
        {"name": "judge", "role": "reward", "model": "policy", "concurrency": 8}], **{
        "domains.frozenlake.reward_pool": "judge",
        "domains.frozenlake.reward": {"kind": "model", "verdicts": VERDICTS}})
    worker_config = tmp_path / "judge-worker.json"
    worker_config.write_text(config.model_dump_json())
    with (tmp_path / "judge-worker.log").open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "rollart.workers.cli", "worker", "--config",
             str(worker_config), "--role", "reward", "--pool", "judge"],
            stdout=log, stderr=subprocess.STDOUT)
    try:
        async with in_process_fleet(config, engine, ("control", "env", "gen")) as client:
            specs = [TrajectorySpec.for_domain(config, "frozenlake", f"judged-{k}", "g", seed=k)
                     for k in range(4)]
            results = await asyncio.gather(*(client.execute_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
                for spec in specs))
    finally:
        worker.terminate()
        worker.wait(30)
    assert all(r.status == "completed" and r.reward_kind == "model" for r in results)
    assert all(0 < r.reward < 1 and r.reward_compute_s > 0 for r in results)
    assert "reward judge" in (tmp_path / "judge-worker.log").read_text()
