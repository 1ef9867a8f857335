"""The Web UI views in dashboards/README.md are queries the server accepts and that find what
they say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from temporalio.client import Client

README = Path(__file__).parent.parent / "dashboards" / "README.md"


def queries() -> list[str]:
    block = re.search(r"```sql\n(.*?)```", README.read_text(), re.DOTALL).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("--")]


def test_the_readme_lists_views():
    assert len(queries()) >= 6


@pytest.mark.asyncio(loop_scope="session")
async def test_every_view_is_a_valid_query(temporal_server):
    client = await Client.connect(temporal_server.address)
    for query in queries():
        async for _ in client.list_workflows(query, limit=1):
            break
