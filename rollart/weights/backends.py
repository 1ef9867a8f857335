"""Where weight buckets live: the Mooncake store (distributed memory, served over TCP or RDMA),
or any blob store (files, S3: rollart.blobs). All speak bytes by key; checking what comes back is
the caller's job, because the Mooncake master evicts objects silently when it runs out of space (a
get then returns nothing).
"""

from __future__ import annotations

from pathlib import Path

from rollart.blobs import ByteStore, open_blobs
from rollart.config import RunConfig
from rollart.servers import LocalServer, free_port, installed_binary

WeightBackend = ByteStore


class BackendError(RuntimeError):
    pass


def mooncake_installed() -> bool:
    try:
        import mooncake.store  # noqa: F401
    except ImportError:
        return False
    return master_binary() is not None


def master_binary() -> str | None:
    return installed_binary("mooncake_master")


class MooncakeBackend:
    """A client of a Mooncake store cluster; it also lends `segment_mib` of this process's memory
    to the cluster (where other clients' objects may be placed)."""

    name = "mooncake"

    def __init__(self, master: str, segment_mib: int = 1024, buffer_mib: int = 256,
                 local_hostname: str = "127.0.0.1") -> None:
        from mooncake.store import MooncakeDistributedStore

        self.store = MooncakeDistributedStore()
        code = self.store.setup(local_hostname, "P2PHANDSHAKE", segment_mib << 20,
                                buffer_mib << 20, "tcp", "", master)
        if code != 0:
            raise BackendError(f"weights.mooncake_master: cannot join the Mooncake store at "
                               f"{master} (setup returned {code}); is mooncake_master running?")
        self.keys: dict[str, set[str]] = {}

    def put(self, key: str, data: bytes) -> None:
        code = self.store.upsert(key, data)  # a plain put keeps an existing object
        if code != 0:
            raise BackendError(f"Mooncake put of {key} ({len(data)} bytes) failed with {code}")

    def get(self, key: str) -> bytes | None:
        data = self.store.get(key)
        return data if data else None

    def delete(self, prefix: str) -> None:
        self.store.remove_by_regex("^" + _regex_escape(prefix))

    def close(self) -> None:
        self.store.close()


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in r".^$*+?{}[]\|()" else c for c in text)


class MooncakeMaster(LocalServer):
    """A `mooncake_master` on 127.0.0.1 (the embedded stack and tests start one)."""

    name = "weights.mooncake_master"

    def __init__(self, port: int, log_file: Path | None = None, lease_ms: int = 200) -> None:
        super().__init__(port, log_file)
        self.lease_ms = lease_ms

    def command(self) -> list[str]:
        binary = master_binary()
        if binary is None:
            raise FileNotFoundError("no mooncake_master: install mooncake-transfer-engine")
        return [binary, f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                f"--metrics_port={free_port()}", f"--default_kv_lease_ttl={self.lease_ms}"]


def backend_choice(config: RunConfig) -> str:
    """"mooncake" or "local": what `weights.backend` means on this machine."""
    if config.weights.backend == "auto":
        return "mooncake" if mooncake_installed() else "local"
    return config.weights.backend


def open_backends(config: RunConfig, lend: bool = True,
                  ) -> tuple[WeightBackend, WeightBackend | None]:
    """(primary, durable) weight backends for this run's config. Only a publisher should `lend`
    memory to the Mooncake store: objects placed in a replica's memory would vanish with the
    replica, and the master keeps placing new ones there until it notices."""
    durable = open_blobs(config.weights_url, config.storage)
    if backend_choice(config) == "local":
        return durable, None
    weights = config.weights
    primary = MooncakeBackend(weights.mooncake_master,
                              weights.mooncake_segment_mib if lend else 0,
                              weights.mooncake_buffer_mib)
    return primary, durable if weights.durable_copy else None
