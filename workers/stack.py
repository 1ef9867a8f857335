"""The embedded stack for one machine: a dev server, the Mooncake master when weights go through
Mooncake, and one process per fleet worker, supervised: a worker that exits is started again
(the run goes on: a restarted replica loads the newest weights before it serves), unless it
crash-loops."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rollart.config import RunConfig
from rollart.servers import die_with_parent
from rollart.weights import MooncakeMaster, backend_choice
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import WORKER_SLOT_ENV
from rollart.workers.zygote import ForkedProcess, ForkServer

log = logging.getLogger("rollart.stack")
FORKED_ROLES = ("gen.", "train.")  # the workers that import torch, transformers and vLLM


class CrashLoopError(RuntimeError):
    """A worker exited more often than the supervisor allows."""


def worker_commands(config_file: Path, config: RunConfig) -> dict[str, list[str]]:
    """One `rollart worker` command per process the config needs, keyed by a log name."""
    base = [sys.executable, "-m", "rollart.workers.cli", "worker", "--config", str(config_file)]
    commands = {"control": base + ["--role", "control"]}
    for pool in config.pools:
        if pool.role == "gen":
            for replica in range(pool.replicas):
                commands[f"gen.{pool.name}.r{replica}"] = base + [
                    "--role", "gen", "--pool", pool.name, "--replica", str(replica)]
        elif pool.colocate_with is None:  # env and reward pools: `replicas` workers each
            for replica in range(pool.replicas):
                suffix = f".r{replica}" if pool.replicas > 1 else ""
                commands[f"{pool.role}.{pool.name}{suffix}"] = base + [
                    "--role", pool.role, "--pool", pool.name]
    return commands


class Stack:
    def __init__(self, config: RunConfig, config_file: Path, start_server: bool = True) -> None:
        self.config, self.config_file = config, config_file
        self.logs = Path(config.run_dir) / "logs"
        host, port = config.temporal.address.rsplit(":", 1)
        self.server = DevServer(Path(config.run_dir) / "temporal.db", int(port),
                                config.temporal.ui_port, self.logs / "temporal.log",
                                codec_endpoint=config.temporal.codec_endpoint)
        self.start_server = start_server
        self.mooncake: MooncakeMaster | None = None
        if backend_choice(config) == "mooncake":
            host, port = config.weights.mooncake_master.rsplit(":", 1)
            self.mooncake = MooncakeMaster(int(port), self.logs / "mooncake_master.log")
        self.commands = worker_commands(config_file, config)
        self.forked = {name for name in self.commands if name.startswith(FORKED_ROLES)}
        self.fork_server: ForkServer | None = None
        if self.forked and config.supervisor.fork_server and not config.simulation.enabled:
            self.fork_server = ForkServer(self.logs / "fork_server.log")
        self.processes: dict[str, subprocess.Popen | ForkedProcess] = {}
        self._cpu: dict[int, tuple[str, float]] = {}
        self.restarts: dict[str, list[float]] = {}  # monotonic times of each worker's restarts
        self.exits: list[dict] = []  # every unexpected exit, for the run directory
        self._due: dict[str, float] = {}  # workers waiting out their backoff

    def start(self) -> Stack:
        self.logs.mkdir(parents=True, exist_ok=True)
        if self.start_server:
            self.server.start()
        if self.mooncake is not None:
            self.mooncake.start()
        if self.fork_server is not None:
            self.fork_server.start()
        # the forked last: the first waits for the fork server's imports
        for name in sorted(self.commands, key=lambda name: name in self.forked):
            self.spawn(name)
        return self

    def spawn(self, name: str) -> None:
        """Start (or start again) the worker process `name`."""
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self._storage_credentials())
        env[WORKER_SLOT_ENV] = f"{Path(self.config.run_dir).name}.{name}"
        command, log_path = self.commands[name], self.logs / f"{name}.log"
        if self.fork_server is not None and name in self.forked:
            self.processes[name] = self.fork_server.spawn(command[1:], env, log_path)
            return
        log = open(log_path, "ab")  # noqa: SIM115 (the child owns it)
        # A session of its own: stopping or killing a worker reaches its engine processes too.
        self.processes[name] = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                env=env, start_new_session=True,
                                                preexec_fn=die_with_parent)

    def kill(self, name: str) -> None:
        """SIGKILL the worker `name` and its children, as a machine crash would (chaos runs)."""
        process = self.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) each process of the stack used so far, by name: the dev
        server, the Mooncake master, each worker, and each worker's children by their own title
        (a generation replica's vLLM engine core and worker). A process that has exited keeps
        the last figure read for it, so call this now and then (rollart train does, each
        second)."""
        import psutil

        roots: dict[str, int] = {}
        # the fork server first: the workers it forked are its children, and each worker's
        # own walk below labels it and its engine processes by the worker's name
        for name, server in (("fork server", self.fork_server),
                             ("temporal dev server", self.server if self.start_server else None),
                             ("mooncake master", self.mooncake)):
            if server is not None and server.process is not None:
                roots[name] = server.process.pid
        roots.update({name: process.pid for name, process in self.processes.items()})
        for name, pid in roots.items():
            try:
                root = psutil.Process(pid)
                family = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for process in family:
                try:
                    label = name if process.pid == pid else f"{name} {_title(process)}"
                    times = process.cpu_times()
                except psutil.Error:
                    continue
                self._cpu[process.pid] = (label, times.user + times.system)
        totals: dict[str, float] = {}
        for label, seconds in self._cpu.values():
            totals[label] = totals.get(label, 0.0) + seconds
        return totals

    def supervise(self, now: float | None = None) -> None:
        """Call now and then (each second): restarts the workers that exited once their backoff
        has passed; raises CrashLoopError when one exited more than max_restarts times within
        window_s."""
        rules = self.config.supervisor
        now = time.monotonic() if now is None else now
        for name, process in self.processes.items():
            if name in self._due or process.poll() is None:
                continue
            with contextlib.suppress(ProcessLookupError):  # its engine processes, if any
                os.killpg(process.pid, signal.SIGKILL)
            recent = [t for t in self.restarts.get(name, []) if now - t < rules.window_s]
            self.restarts[name] = recent
            log_path = self.logs / f"{name}.log"
            if len(recent) >= rules.max_restarts:
                raise CrashLoopError(
                    f"worker {name} exited with {process.returncode} after {len(recent)} "
                    f"restarts within {rules.window_s:.0f} s (supervisor.max_restarts); "
                    f"see {log_path}")
            wait = min(rules.backoff_s * 2 ** len(recent), rules.max_backoff_s)
            self._due[name] = now + wait
            self.exits.append({"worker": name, "returncode": process.returncode,
                               "restart_in_s": wait, "at": time.time()})
            log.warning("worker %s exited with %s; restarting it in %.0f s (log %s)", name,
                        process.returncode, wait, log_path)
        for name, due in list(self._due.items()):
            if now >= due:
                del self._due[name]
                self.restarts.setdefault(name, []).append(now)
                self.spawn(name)
                last_exit = next(e for e in reversed(self.exits) if e["worker"] == name)
                last_exit["restarted_at"] = time.time()

    @property
    def restarts_due(self) -> int:
        """Workers that exited and wait out their backoff."""
        return len(self._due)

    @property
    def restart_count(self) -> int:
        return len(self.exits)

    def write_supervision(self, path: Path) -> None:
        path.write_text(json.dumps({"worker_restarts": self.restart_count,
                                    "exits": self.exits}, indent=2) + "\n")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.terminate()
        deadline = time.monotonic() + 15
        for process in self.processes.values():
            try:
                process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
            with contextlib.suppress(ProcessLookupError):  # engine processes left behind
                os.killpg(process.pid, signal.SIGKILL)
        self.processes.clear()
        if self.fork_server is not None:
            self.fork_server.stop()
        if self.mooncake is not None:
            self.mooncake.stop()
        if self.start_server:
            self.server.stop()

    def _storage_credentials(self) -> dict[str, str]:
        """The config's S3 credentials, handed to the workers through their environment (the
        config file they read has none: credentials are never serialized)."""
        storage, env = self.config.storage, {}
        if storage.access_key_id:
            env["AWS_ACCESS_KEY_ID"] = storage.access_key_id
        if storage.secret_access_key:
            env["AWS_SECRET_ACCESS_KEY"] = storage.secret_access_key.get_secret_value()
        return env

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _title(process) -> str:
    """A child's name as it shows in `ps`: vLLM retitles its engine processes."""
    command = process.cmdline()
    return command[0] if command and command[0].startswith("VLLM::") else process.name()
