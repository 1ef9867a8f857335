"""The fork server the embedded stack starts its heavy workers from, on real processes (with a
light preload: the stack's own preloads torch, transformers and vLLM)."""

from __future__ import annotations

import os
import signal
import time

import psutil
import pytest

from rollart.workers.zygote import ForkServer


@pytest.fixture
def server(tmp_path):
    forks = ForkServer(tmp_path / "fork_server.log", preload=["json"]).start()
    yield forks
    forks.stop()


def test_a_forked_worker_runs_its_command_with_its_env_log_and_title(server, tmp_path):
    log = tmp_path / "worker.log"
    code = ("import os, sys, time; print('hello', os.environ['GREETING'], flush=True); "
            "time.sleep(30)")
    worker = server.spawn(["-c", code], {"GREETING": "from the env"}, log)
    deadline = time.monotonic() + 10
    while "hello" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the forked worker did not write its log"
        time.sleep(0.05)
    assert "hello from the env" in log.read_text()
    process = psutil.Process(worker.pid)
    assert os.getsid(worker.pid) == worker.pid  # a session of its own, as Popen's workers
    assert process.ppid() == server.process.pid
    assert "-c import os, sys" in " ".join(process.cmdline())  # ps shows the worker's command
    assert worker.poll() is None
    os.killpg(worker.pid, signal.SIGKILL)
    assert worker.wait(10) == -signal.SIGKILL


@pytest.mark.parametrize("code, returncode, printed", [
    ("import sys; sys.exit(3)", 3, ""),
    ("raise SystemExit('rollart worker: a clear reason')", 1, "a clear reason"),
    ("raise ValueError('boom')", 1, "ValueError: boom"),
    ("pass", 0, ""),
])
def test_a_forked_worker_exits_with_the_status_python_would_give(server, tmp_path, code,
                                                                  returncode, printed):
    log = tmp_path / "worker.log"
    worker = server.spawn(["-c", code], dict(os.environ), log)
    assert worker.wait(10) == returncode
    assert printed in log.read_text()


def test_workers_die_with_the_server_and_the_next_spawn_starts_it_again(server, tmp_path):
    worker = server.spawn(["-c", "import time; time.sleep(60)"], {}, tmp_path / "w.log")
    first = server.process
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(10)
    assert worker.wait(10) == -9  # reported killed: it dies with its parent
    deadline = time.monotonic() + 10
    while psutil.pid_exists(worker.pid) and psutil.Process(worker.pid).status() != "zombie":
        assert time.monotonic() < deadline, "the worker outlived its fork server"
        time.sleep(0.05)
    again = server.spawn([
        "-c", "import sys; sys.exit(0 if 'json' in sys.modules else 5)"], {}, tmp_path / "x.log")
    assert server.process is not first
    assert again.wait(10) == 0  # forked from the new server, with its preload


def test_the_stack_forks_heavy_workers_only_when_they_import_the_heavy_modules(tmp_path):
    from rollart.config import load_config
    from rollart.workers.stack import Stack

    real = Stack(load_config(None, run_dir=str(tmp_path / "a")), tmp_path / "c.json")
    assert real.fork_server is not None
    assert real.forked == {"gen.cpu.r0", "train.cpu"}
    pools = [{"name": "cpu", "role": role} for role in ("env", "reward", "train")]
    pools.append({"name": "cpu", "role": "gen", "hardware": "h800"})
    simulated = Stack(load_config(None, run_dir=str(tmp_path / "b"), pools=pools,
                                  **{"simulation.enabled": True}), tmp_path / "c.json")
    assert simulated.fork_server is None
    off = Stack(load_config(None, run_dir=str(tmp_path / "c"),
                            **{"supervisor.fork_server": False}), tmp_path / "c.json")
    assert off.fork_server is None
    assert real.commands["gen.cpu.r0"][1:3] == ["-m", "rollart.workers.cli"]


def test_an_exit_reported_with_its_pid_is_not_lost(server, tmp_path):
    """A worker that exits at once: the server's pid and exit lines can come in one read."""
    workers = [server.spawn(["-c", "pass"], {}, tmp_path / f"w{k}.log") for k in range(5)]
    time.sleep(0.5)
    assert [worker.wait(10) for worker in workers] == [0] * 5


def test_a_forked_workers_cpu_is_counted_under_its_own_name(tmp_path):
    """The forked workers are the fork server's children: the CPU table names them by role."""
    import sys

    from rollart.config import load_config
    from rollart.workers.stack import Stack

    config = load_config(None, run_dir=str(tmp_path), **{"weights.backend": "local"})
    stack = Stack(config, tmp_path / "config.json", start_server=False)
    stack.fork_server = ForkServer(tmp_path / "fork_server.log", preload=["json"]).start()
    spin = "import time\nend = time.process_time() + 5\nwhile time.process_time() < end: pass"
    stack.commands = {"gen.cpu.r0": [sys.executable, "-c", spin]}
    stack.forked = {"gen.cpu.r0"}
    stack.logs.mkdir(parents=True)
    try:
        stack.spawn("gen.cpu.r0")
        worker = psutil.Process(stack.processes["gen.cpu.r0"].pid)
        while sum(worker.cpu_times()[:2]) < 0.3:
            time.sleep(0.05)
        seen = stack.cpu_seconds()
        os.killpg(worker.pid, signal.SIGKILL)
    finally:
        stack.fork_server.stop()
    assert seen.get("gen.cpu.r0", 0) >= 0.3, seen
    assert not any(name.startswith("fork server ") for name in seen), seen
