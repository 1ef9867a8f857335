"""What a training run really trained, read back from Temporal: the train.step inputs in every
run of the training workflow (across continue-as-new). The evidence behind "nothing is trained
twice" in the chaos benchmark and the tests."""

from __future__ import annotations

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from rollart.contracts import Activity, TrainRequest


async def trained_ids_by_iteration(client: Client, workflow_id: str) -> dict[int, list[str]]:
    batches: dict[int, list[str]] = {}
    async for execution in client.list_workflows(f"WorkflowId = '{workflow_id}'"):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                continue
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name != Activity.TRAIN_STEP:
                continue
            [request] = await client.data_converter.decode(attrs.input.payloads, [TrainRequest])
            batches[request.iteration] = [s.trajectory_id for s in request.samples]
    return batches
