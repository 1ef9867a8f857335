"""Re-running a failed trajectory (`rollart replay <workflow id>`).

A replay resets the trajectory to its first workflow task, exactly what
`temporal workflow reset --type FirstWorkflowTask` does: the failed run stays in the history for
inspection, and the new run keeps the workflow id, the input and the parent, so it reports to the
training run as the first one did. A trajectory of a lockstep batch (rollout_unit batch or auto)
was no workflow of its own: it is found by its batch's group-number tags and started afresh as a
TrajectoryWorkflow with its id and spec, reporting to the batch's training run. The run takes the
result if the trajectory's group still waits in the buffer (it is then admissible under alpha)
and counts it late otherwise; see rollart.workflows.buffer."""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from rollart.contracts import TrainingStatus, TrajectoryResult, TrajectorySpec
from rollart.search_attributes import RUN, batch_query, of_trajectory

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
    batch_id: str | None = None


async def replay(client: Client, workflow_id: str) -> Replay:
    """Starts the re-run and returns at once; `outcome` waits for what became of it."""
    try:
        described = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status != RPCStatusCode.NOT_FOUND:
            raise
        batch_id = await _batch_of(client, workflow_id)
        if batch_id is None:
            raise ReplayError(f"no workflow {workflow_id!r} in namespace {client.namespace!r}, "
                              "and no lockstep batch ran a trajectory of that id") from err
        return await _rerun_member(client, workflow_id, batch_id)
    if described.workflow_type != TRAJECTORY_TYPE:
        raise ReplayError(f"{workflow_id} is a {described.workflow_type}, not a "
                          f"{TRAJECTORY_TYPE}: only trajectories are replayed")
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ReplayError(f"{workflow_id} is still running; wait for it to end (or cancel it)")
    history = await client.get_workflow_handle(workflow_id,
                                               run_id=described.run_id).fetch_history()
    [spec] = await _decoded(client, history.events[0].workflow_execution_started_event_attributes
                            .input, TrajectorySpec)
    training_id = described.parent_id or spec.report_to or None
    parent_running, readmitted_before = await _training_state(client, training_id, workflow_id)
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
        parent_id=training_id, parent_running=parent_running,
        readmitted_before=readmitted_before,
        task_queue=described.task_queue,
        workers_polling=await _polled(client, described.task_queue))


async def _batch_of(client: Client, trajectory_id: str) -> str | None:
    """The lockstep batch that ran `trajectory_id` (tagged with its groups' numbers)."""
    query = batch_query(trajectory_id)
    if query is None:
        return None
    try:
        async for execution in client.list_workflows(query, limit=1):
            return execution.id
    except RPCError as err:  # a namespace without rollart's search attributes
        if err.status != RPCStatusCode.INVALID_ARGUMENT:
            raise
    return None


async def _rerun_member(client: Client, trajectory_id: str, batch_id: str) -> Replay:
    """A batch's trajectory was no workflow of its own: it is re-run as a TrajectoryWorkflow of
    the same id and spec that reports to the batch's training run, as its batch would have."""
    batch = client.get_workflow_handle(batch_id)
    described = await batch.describe()
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ReplayError(f"{trajectory_id} is a trajectory of lockstep batch {batch_id}, which "
                          "is still running; wait for it to end (or cancel it)")
    history = await batch.fetch_history()
    [specs] = await _decoded(client, history.events[0].workflow_execution_started_event_attributes
                             .input, list[TrajectorySpec])
    spec = next(s for s in specs if s.trajectory_id == trajectory_id)
    previous = described.status.name.lower() if described.status else "unknown"
    ended = history.events[-1]
    if ended.HasField("workflow_execution_completed_event_attributes"):
        [results] = await _decoded(
            client, ended.workflow_execution_completed_event_attributes.result,
            list[TrajectoryResult])
        previous = next(r.status for r in results if r.trajectory_id == trajectory_id)
    training_id = described.parent_id
    parent_running, readmitted_before = await _training_state(client, training_id,
                                                              trajectory_id)
    tags = (of_trajectory(training_id, spec.domain, spec.group_id, spec.start_version)
            if training_id and described.typed_search_attributes.get(RUN) else None)
    started = await client.start_workflow(
        TRAJECTORY_TYPE, spec.model_copy(update={"report_to": training_id or ""}),
        id=trajectory_id, task_queue=described.task_queue, search_attributes=tags)
    return Replay(
        workflow_id=trajectory_id, run_id=started.result_run_id or "",
        failed_run_id=described.run_id, previous_status=previous, parent_id=training_id,
        parent_running=parent_running, readmitted_before=readmitted_before,
        task_queue=described.task_queue,
        workers_polling=await _polled(client, described.task_queue), batch_id=batch_id)


async def _decoded(client: Client, payloads: Payloads, kind: type) -> list:
    return await client.data_converter.decode(payloads.payloads, [kind])


async def _training_state(client: Client, training_id: str | None,
                          trajectory_id: str) -> tuple[bool, bool]:
    """Whether the training run still runs, and whether it took a re-run of this one already
    (a trajectory re-enters at most once)."""
    if not training_id:
        return False, False
    training = client.get_workflow_handle(training_id)
    if (await training.describe()).status != WorkflowExecutionStatus.RUNNING:
        return False, False
    status = await training.query("status", result_type=TrainingStatus)
    return True, trajectory_id in status.readmitted_ids


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
