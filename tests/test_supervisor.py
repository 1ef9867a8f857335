"""`rollart train` keeps its fleet up: a worker killed as the OOM killer would is started again
and the run finishes with nothing lost. The fleet runs on simulated compute, so a replica
restarts in a second; the processes, the dev server and the weight path are real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from rollart.servers import free_port

CONFIG = """
run_dir = "{run_dir}"
[temporal]
address = "127.0.0.1:{port}"
ui_port = {ui_port}
[weights]
backend = "local"
[simulation]
enabled = true
time_scale = 0.02
[algorithm]
group_size = 4
batch_size = 16
minibatches = 1
iterations = 6
[trainer]
checkpoint_every = 0
[domains.frozenlake.faults]
step_mean_s = 0.1
step_std_s = 0.05
[[pools]]
name = "cpu"
role = "env"
[[pools]]
name = "h800"
role = "gen"
hardware = "h800"
[[pools]]
name = "cpu"
role = "reward"
[[pools]]
name = "cpu"
role = "train"
[domains.frozenlake]
gen_pool = "h800"
"""


def worker_pid(launcher: subprocess.Popen, role: str) -> int:
    for child in psutil.Process(launcher.pid).children():
        if f"--role {role}" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"no {role} worker under the launcher")


def test_a_killed_replica_is_restarted_and_the_run_finishes(tmp_path):
    run_dir = tmp_path / "run"
    config = tmp_path / "sim.toml"
    config.write_text(CONFIG.format(run_dir=run_dir, port=free_port(), ui_port=free_port()))
    launcher = subprocess.Popen([sys.executable, "-m", "rollart.workers.cli", "train",
                                 "--config", str(config)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not (metrics.exists() and metrics.read_text().strip()):
            assert launcher.poll() is None, launcher.stderr.read()
            assert time.monotonic() < deadline, "no iteration within 180 s"
            time.sleep(0.5)
        os.killpg(worker_pid(launcher, "gen"), signal.SIGKILL)
        assert launcher.wait(timeout=300) == 0, launcher.stderr.read()
    finally:
        if launcher.poll() is None:
            launcher.send_signal(signal.SIGINT)
            launcher.wait(timeout=60)
    supervision = json.loads((run_dir / "supervisor.json").read_text())
    assert supervision["worker_restarts"] == 1
    assert supervision["exits"][0]["worker"] == "gen.h800.r0"
    status = json.loads(Path(run_dir / "status.json").read_text())
    ledger = status["ledger"]
    assert status["iteration"] == 6 and ledger["failed"] == 0
    assert ledger["trained"] == 6 * 16
    assert ledger["started"] == ledger["trained"] + ledger["evicted"]
