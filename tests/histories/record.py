"""Record the workflow histories that tests/test_replay.py replays.

Runs a short training run (two iterations, so it has trained, updated and evicted), a lone
trajectory, a trajectory whose env crashes (the failure path) and a lockstep batch in which one
env crashes (it fails alone) on a fresh dev server, and writes
their histories as JSON beside this file. Rerun it only on purpose, when a workflow change is
meant to break compatibility with running workflows; name workflow ids to record only those:

  .venv/bin/python tests/histories/record.py [replay-trajectory-failed ...]
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))

import envs_for_tests  # noqa: E402, F401  (registers the crashing env)
from conftest import make_config  # noqa: E402
from temporalio.client import WorkflowFailureError  # noqa: E402

from rollart.contracts import TrainingStatus, TrajectoryResult, TrajectorySpec  # noqa: E402
from rollart.search_attributes import of_trajectory  # noqa: E402
from rollart.servers import free_port  # noqa: E402
from rollart.workers.devserver import DevServer  # noqa: E402
from rollart.workers.fleet import in_process_fleet  # noqa: E402
from rollart.workflows.batch_rollout import BatchRolloutWorkflow  # noqa: E402
from rollart.workflows.training import TrainingInput, TrainingWorkflow  # noqa: E402
from rollart.workflows.trajectory import TrajectoryWorkflow  # noqa: E402


async def record(server: DevServer, run_dir: Path, only: set[str]) -> None:
    config = make_config(server, run_dir, **{
        "algorithm.group_size": 2, "algorithm.batch_size": 4, "algorithm.iterations": 2,
        "algorithm.minibatches": 1, "domains.frozenlake.max_turns": 4})
    crashing = config.model_copy(deep=True)
    crashing.domains["frozenlake"].env = "exploding"
    crashing.domains["frozenlake"].kwargs = {"every": 1}
    async with in_process_fleet(config) as client:
        await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="replay-training",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        spec = TrajectorySpec.for_domain(config, "frozenlake", "replay-trajectory", "g", seed=3)
        await client.execute_workflow(
            TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
            task_queue=config.temporal.control_queue, result_type=TrajectoryResult)
        spec = TrajectorySpec.for_domain(crashing, "frozenlake", "replay-trajectory-failed", "g",
                                         seed=4)
        with contextlib.suppress(WorkflowFailureError):  # it is meant to fail
            await client.execute_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=config.temporal.control_queue, result_type=TrajectoryResult,
                search_attributes=of_trajectory("replay-training", "frozenlake", "g", 0))
        crashing.domains["frozenlake"].kwargs = {"every": 3}
        specs = [TrajectorySpec.for_domain(crashing, "frozenlake", f"replay-batch.t{i}", "g",
                                           seed=5 + i) for i in range(3)]
        await client.execute_workflow(
            BatchRolloutWorkflow.run, specs, id="replay-batch",
            task_queue=config.temporal.control_queue, result_type=list[TrajectoryResult])
        children = [w.id async for w in client.list_workflows(
            "WorkflowType='TrajectoryWorkflow' AND WorkflowId STARTS_WITH 'replay-training'")]
        for workflow_id in ("replay-training", "replay-trajectory", "replay-trajectory-failed",
                            "replay-batch", sorted(children)[0]):
            if only and workflow_id not in only:
                continue
            history = await client.get_workflow_handle(workflow_id).fetch_history()
            (HERE / f"{workflow_id}.json").write_text(history.to_json())
            print(f"recorded {workflow_id}: {len(history.events)} events")


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp, DevServer(
            Path(tmp) / "temporal.db", free_port(), None) as server:
        asyncio.run(record(server, Path(tmp) / "run", set(sys.argv[1:])))


if __name__ == "__main__":
    main()
