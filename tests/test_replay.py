"""Recorded histories of both workflows (and of a failed trajectory) replay against today's
code: a change that would break workflows already running (non-determinism) fails here. Record
anew, on purpose only, with tests/histories/record.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.training import TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

HISTORIES = Path(__file__).parent / "histories"
RECORDED = sorted(HISTORIES.glob("*.json"))


def replayer() -> Replayer:
    return Replayer(workflows=[TrainingWorkflow, TrajectoryWorkflow, BatchRolloutWorkflow],
                    data_converter=pydantic_data_converter)


@pytest.mark.asyncio(loop_scope="session")
@pytest.mark.parametrize("path", RECORDED, ids=[p.stem for p in RECORDED])
async def test_recorded_history_replays(path):
    history = WorkflowHistory.from_json(path.stem, path.read_text())  # named by workflow id
    result = await replayer().replay_workflow(history)
    assert result.replay_failure is None


def test_both_workflows_are_recorded():
    assert {p.stem for p in RECORDED} >= {"replay-training", "replay-trajectory",
                                          "replay-trajectory-failed", "replay-batch",
                                          "replay-training.g000000.t00"}


@pytest.mark.asyncio(loop_scope="session")
async def test_a_non_deterministic_change_is_caught():
    """The replay test can fail: a history whose recorded commands no longer match the code."""
    recorded = json.loads((HISTORIES / "replay-trajectory.json").read_text())
    scheduled = next(e for e in recorded["events"]
                     if e["eventType"] == "EVENT_TYPE_ACTIVITY_TASK_SCHEDULED")
    scheduled["activityTaskScheduledEventAttributes"]["activityType"]["name"] = "env.renamed"
    history = WorkflowHistory.from_json("replay-trajectory", json.dumps(recorded))
    result = await replayer().replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is not None
