"""Re-running a failed trajectory (`rollart replay <workflow id>`).

A replay resets the trajectory to its first workflow task, exactly what
`temporal workflow reset --type FirstWorkflowTask` does: the failed run stays in the history for
inspection, and the new run keeps the workflow id, the input and the parent, so it reports to the
training run as the first one did. The run takes the result if the trajectory's group still waits
in the buffer (it is then admissible under alpha) and counts it late otherwise; see
rollart.workflows.buffer."""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from rollart.contracts import TrainingStatus, TrajectoryResult

TRAJECTORY_TYPE = "TrajectoryWorkflow"


class ReplayError(Exception):
    """The workflow cannot be replayed (unknown, not a trajectory, still running)."""


class Replay(BaseModel):
    workflow_id: str
    run_id: str
    failed_run_id: str
    previous_status: str
    parent_id: str | None
    parent_running: bool
    readmitted_before: bool = False
    task_queue: str
    workers_polling: bool


async def replay(client: Client, workflow_id: str) -> Replay:
    """Starts the re-run and returns at once; `outcome` waits for what became of it."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ReplayError(f"no workflow {workflow_id!r} in namespace "
                              f"{client.namespace!r}") from err
        raise
    if described.workflow_type != TRAJECTORY_TYPE:
        raise ReplayError(f"{workflow_id} is a {described.workflow_type}, not a "
                          f"{TRAJECTORY_TYPE}: only trajectories are replayed")
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ReplayError(f"{workflow_id} is still running; wait for it to end (or cancel it)")
    parent_running, readmitted_before = False, False
    if described.parent_id:
        parent = client.get_workflow_handle(described.parent_id)
        parent_running = (await parent.describe()).status == WorkflowExecutionStatus.RUNNING
        if parent_running:  # a trajectory re-enters at most once
            status = await parent.query("status", result_type=TrainingStatus)
            readmitted_before = workflow_id in status.readmitted_ids
    history = await client.get_workflow_handle(workflow_id,
                                               run_id=described.run_id).fetch_history()
    first_task = next(e.event_id for e in history.events
                      if e.HasField("workflow_task_completed_event_attributes"))
    reset = await client.workflow_service.reset_workflow_execution(ResetWorkflowExecutionRequest(
        namespace=client.namespace,
        workflow_execution=WorkflowExecution(workflow_id=workflow_id, run_id=described.run_id),
        reason="rollart replay", workflow_task_finish_event_id=first_task,
        request_id=str(uuid.uuid4())))
    return Replay(
        workflow_id=workflow_id, run_id=reset.run_id, failed_run_id=described.run_id,
        previous_status=described.status.name.lower() if described.status else "unknown",
        parent_id=described.parent_id, parent_running=parent_running,
        readmitted_before=readmitted_before,
        task_queue=described.task_queue,
        workers_polling=await _polled(client, described.task_queue))


async def _polled(client: Client, task_queue: str) -> bool:
    pollers = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=task_queue),
        task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW))
    return bool(pollers.pollers)


async def outcome(client: Client, started: Replay, timeout_s: float = 600) -> str:
    """Waits for the re-run to end and says what the training run made of it."""
    handle = client.get_workflow_handle(started.workflow_id, run_id=started.run_id,
                                        result_type=TrajectoryResult)
    try:
        result = await asyncio.wait_for(handle.result(), timeout_s)
    except WorkflowFailureError as err:
        cause = err.cause.message if err.cause is not None else str(err)
        return f"the re-run failed too: {cause}"
    ended = f"the re-run {result.status} ({result.turns} turns, reward {result.reward:g})"
    if not started.parent_id:
        return f"{ended}; it belongs to no training run"
    status = await client.get_workflow_handle(started.parent_id).query(
        "status", result_type=TrainingStatus)
    if not started.readmitted_before and started.workflow_id in status.readmitted_ids:
        return f"{ended} and re-entered the buffer of {started.parent_id}"
    if status.done or not started.parent_running:
        return f"{ended}; {started.parent_id} had ended, so it is not trained"
    return (f"{ended}; {started.parent_id} counted it late (its group was trained or evicted "
            "meanwhile)")
