"""rollart's search attributes get into a namespace that lacks them, or the error says how."""

from __future__ import annotations

import uuid

import pytest
from google.protobuf.duration_pb2 import Duration
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client

from rollart import search_attributes

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_register_adds_what_a_namespace_lacks(temporal_server):
    client = await Client.connect(temporal_server.address)
    namespace = f"fresh-{uuid.uuid4().hex[:8]}"
    await client.workflow_service.register_namespace(RegisterNamespaceRequest(
        namespace=namespace, workflow_execution_retention_period=Duration(seconds=86400)))
    request = ListSearchAttributesRequest(namespace=namespace)
    before = await client.operator_service.list_search_attributes(request)
    assert "RollartRun" not in before.custom_attributes
    await search_attributes.register(client, namespace)
    await search_attributes.register(client, namespace)  # twice: nothing left to add
    after = await client.operator_service.list_search_attributes(request)
    assert {key.name for key in search_attributes.ALL} <= set(after.custom_attributes)


async def test_where_it_cannot_register_it_says_what_to_run(temporal_server):
    client = await Client.connect(temporal_server.address)
    with pytest.raises(RuntimeError) as err:
        await search_attributes.register(client, "no-such-namespace")
    message = str(err.value)
    assert ("temporal operator search-attribute create --namespace no-such-namespace "
            "--name RollartRun --type Keyword") in message
    assert "temporal.search_attributes = false" in message
