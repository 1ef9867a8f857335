"""Shared fixtures: a real Temporal dev server and one real vLLM engine for the whole session."""

from __future__ import annotations

from pathlib import Path

import pytest
import pytest_asyncio

from rollart.config import RunConfig, load_config
from rollart.policy.model import resolve_model_path
from rollart.workers.devserver import DevServer, free_port


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory) -> DevServer:
    db = tmp_path_factory.mktemp("temporal") / "temporal.db"
    # Suggest continue-as-new early so every multi-iteration run in the tests exercises it.
    with DevServer(db, port=free_port(), ui_port=None,
                   dynamic_config={"limit.historyCount.suggestContinueAsNew": 60}) as server:
        yield server


@pytest.fixture(scope="session")
def model_path() -> str:
    return resolve_model_path(None)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def engine(model_path):
    from rollart.config import EngineConfig
    from rollart.policy.engine import PolicyEngine

    policy = await PolicyEngine(model_path, EngineConfig()).start()
    yield policy
    policy.shutdown()


def make_config(temporal_server: DevServer, run_dir: Path, **overrides) -> RunConfig:
    overrides = {"temporal.address": temporal_server.address, "run_dir": str(run_dir),
                 **overrides}
    return load_config(None, **overrides)
