"""Server processes a run starts beside itself on 127.0.0.1 (the Temporal dev server, a Mooncake
master, test servers): finding their binaries, a free port, and starting and stopping them."""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def installed_binary(name: str) -> str | None:
    """A program a pip package installed beside this Python (else one on PATH), or None."""
    beside_python = Path(sys.executable).parent / name
    return str(beside_python) if beside_python.exists() else shutil.which(name)


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` nothing listens on now (for servers in tests and benchmarks)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex((host, port)) == 0


_LIBC = ctypes.CDLL("libc.so.6") if sys.platform.startswith("linux") else None
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """A `preexec_fn`: the child gets SIGKILL when the process that started it dies, however it
    dies (Linux), so a launcher killed outright leaves no servers or workers behind to collide
    with the ones a resumed run starts. libc is loaded beforehand: between fork and exec only a
    plain C call is safe."""
    if _LIBC is not None:
        _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
        self.process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                        preexec_fn=die_with_parent)
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
