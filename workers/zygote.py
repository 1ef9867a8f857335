"""A fork server for the embedded stack's heavy workers: one process imports torch,
transformers and vLLM once, and every generation replica and trainer process is forked from it.

A worker started from scratch spends ~12 CPU-s importing those before its engine starts; with
two replicas and a trainer starting at once on two cores (a run's start, a resume), that is
most of the time until the first turn. Forked, a worker starts in its engine's own start-up
time, and a killed one comes back in seconds. The forked worker is the same program
(`python -m rollart.workers.cli worker ...`, retitled so `ps` shows that command), in a session
of its own, and it dies with this process as this process dies with its stack.

Protocol: JSON lines on stdin, `{"argv": [...], "env": {...}, "log": path}`, answered on the
reply pipe with `{"pid": N}`; each forked worker that exits is reported there as
`{"exited": N, "returncode": rc}`. The server ends when its stdin closes.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from rollart.servers import die_with_parent

PRELOAD = ["torch", "transformers", "transformers.models.auto.tokenization_auto", "vllm",
           "vllm.engine.arg_utils", "vllm.v1.engine.async_llm", "rollart.workers.fleet",
           "rollart.policy.engine", "rollart.policy.trainer", "rollart.activities.generate",
           "rollart.activities.train"]


try:
    from setproctitle import setproctitle as _retitle  # vLLM's dependency, for its own titles
except ImportError:
    _retitle = None


def serve(replies: int, preload: list[str]) -> None:
    for module in preload:
        importlib.import_module(module)
    sys.stdout.flush()
    children: set[int] = set()
    pending = b""
    while True:
        readable, _, _ = select.select([sys.stdin.fileno()], [], [], 0.2)
        if readable:
            data = os.read(sys.stdin.fileno(), 1 << 16)
            if not data:
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = _fork(json.loads(line), replies)
                children.add(pid)
                _send(replies, {"pid": pid})
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            _send(replies, {"exited": pid, "returncode": os.waitstatus_to_exitcode(status)})


def _send(fd: int, message: dict) -> None:
    os.write(fd, (json.dumps(message) + "\n").encode())


def _fork(request: dict, replies: int) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setsid()
        die_with_parent()
        os.close(replies)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        argv = request["argv"]
        if _retitle is not None:  # before the environment changes: it finds argv's memory by it
            _retitle(" ".join([sys.executable, *argv]))
        os.environ.clear()
        os.environ.update(request["env"])
        code = _run(argv)
    except SystemExit as err:  # as the interpreter reports it: a message means status 1
        code = 0 if err.code is None else err.code if isinstance(err.code, int) else 1
        if isinstance(err.code, str):
            print(err.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _run(argv: list[str]) -> int:
    """`argv` as the python command line would run it: `-m module args...` or `-c code`."""
    if argv[:1] == ["-m"]:
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[:1] == ["-c"]:
        sys.argv = ["-c", *argv[2:]]
        exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        raise ValueError(f"fork server: cannot run {argv!r} (-m or -c only)")
    return 0


class ForkedProcess:
    """A worker forked by the server, with the part of Popen's surface the stack uses. Its exit
    status comes from the server, which is its parent."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self.server, self.pid = server, pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.collect()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"forked worker {self.pid}", timeout)
            time.sleep(0.05)
        return self.returncode

    def terminate(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


class ForkServer:
    """The stack's side: starts the server (again, if it died) and forks workers from it."""

    def __init__(self, log_file: Path, preload: list[str] | None = None) -> None:
        self.log_file = log_file
        self.preload = PRELOAD if preload is None else preload
        self.process: subprocess.Popen | None = None
        self._replies = -1
        self._pending = b""
        self._forked: dict[int, ForkedProcess] = {}  # running, by pid
        self._started: list[ForkedProcess] = []  # forked, not yet handed to spawn's caller

    def start(self) -> ForkServer:
        read, write = os.pipe()
        with self.log_file.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rollart.workers.zygote", str(write), *self.preload],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=[write],
                start_new_session=True, preexec_fn=die_with_parent)
        os.close(write)
        os.set_blocking(read, False)
        self._replies, self._pending = read, b""
        return self

    def spawn(self, argv: list[str], env: dict[str, str], log: Path,
              timeout_s: float = 60) -> ForkedProcess:
        """Fork a worker running `python ARGV`; ARGV is `-m module ...` or `-c code`."""
        if self.process is None or self.process.poll() is not None:
            self.stop()
            self.start()
        request = {"argv": argv, "env": env, "log": str(log)}
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        self.process.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while not self._started:
            self._receive()
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start a worker (see "
                                   f"{self.log_file})")
            time.sleep(0.01)
        return self._started.pop(0)

    def collect(self) -> None:
        """Record the exits the server reported; when the server itself is gone, its workers
        (killed with it) are reported as killed."""
        self._receive()
        if self.process is not None and self.process.poll() is not None:
            for forked in self._forked.values():
                forked.returncode = -9
            self._forked.clear()

    def _receive(self) -> None:
        """Every message the server sent so far, in order: a worker's exit may follow its pid in
        the same read."""
        if self._replies < 0:
            return
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(self._replies, 1 << 16):
                self._pending += chunk
        *lines, self._pending = self._pending.split(b"\n")
        for message in (json.loads(line) for line in lines if line):
            if "pid" in message:
                forked = ForkedProcess(self, message["pid"])
                self._forked[forked.pid] = forked
                self._started.append(forked)
            elif (forked := self._forked.pop(message["exited"], None)) is not None:
                forked.returncode = message["returncode"]

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(BrokenPipeError, OSError):
                self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.collect()
        if self._replies >= 0:
            os.close(self._replies)
            self._replies = -1
        self.process = None


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2:])
