"""`rollart train` keeps its fleet up: a worker killed as the OOM killer would is started again
and the run finishes with nothing lost. The fleet runs on simulated compute, so a replica
restarts in a second; the processes, the dev server and the weight path are real."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

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
[domains.frozenlake.timeouts]
pickup_s = 5.0
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


def launch(*args: str, stdout=subprocess.DEVNULL) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rollart.workers.cli", "train", *args],
                            stdout=stdout, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def wait_for_iterations(launcher: subprocess.Popen, run_dir: Path, count: int) -> None:
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= count):
        assert launcher.poll() is None, launcher.stderr.read()
        assert time.monotonic() < deadline, f"not {count} iterations within 180 s"
        time.sleep(0.5)


def stop(launcher: subprocess.Popen) -> None:
    if launcher.poll() is None:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)


def worker_pid(launcher: subprocess.Popen, role: str) -> int:
    for child in psutil.Process(launcher.pid).children():
        if f"--role {role}" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"no {role} worker under the launcher")


@pytest.mark.parametrize("role, name", [("gen", "gen.h800.r0"), ("control", "control"),
                                        ("env", "env.cpu")])
def test_a_killed_worker_is_restarted_at_once_and_the_run_finishes(tmp_path, role, name):
    """The control worker too: the launcher's progress query waits for it, and the supervisor
    used to run only between queries, so it restarted the control worker 31 s late. A restarted
    env worker polls its predecessor's queue, so the steps of episodes it lost are answered
    at once (and the episodes rebuilt) instead of waiting out pickup_s."""
    run_dir = tmp_path / "run"
    config = tmp_path / "sim.toml"
    config.write_text(CONFIG.format(run_dir=run_dir, port=free_port(), ui_port=free_port()))
    launcher = launch("--config", str(config))
    try:
        wait_for_iterations(launcher, run_dir, 1)
        killed_at = time.time()
        os.killpg(worker_pid(launcher, role), signal.SIGKILL)
        assert launcher.wait(timeout=300) == 0, launcher.stderr.read()
    finally:
        stop(launcher)
    supervision = json.loads((run_dir / "supervisor.json").read_text())
    assert supervision["worker_restarts"] == 1
    assert supervision["exits"][0]["worker"] == name
    # the supervisor checks each second; the backoff is 1 s
    assert supervision["exits"][0]["restarted_at"] - killed_at < 5
    if role == "env":
        ups = [line.split("up: ")[1] for line in
               (run_dir / "logs" / "env.cpu.log").read_text().splitlines() if "worker up" in line]
        assert len(ups) == 2 and ups[0] == ups[1], ups
    status = json.loads(Path(run_dir / "status.json").read_text())
    ledger = status["ledger"]
    assert status["iteration"] == 6 and ledger["failed"] == 0
    assert ledger["trained"] == 6 * 16
    assert ledger["started"] == ledger["trained"] + ledger["evicted"]


def test_a_run_whose_launcher_was_killed_resumes_where_it_was(tmp_path):
    """SIGKILL to the launcher's whole process group (dev server and workers die with it), then
    `rollart train --resume`: the same TrainingWorkflow finishes from the run's own database,
    store and weights, nothing lost and nothing trained twice."""
    from rollart.workers.audit import trained_ids_by_iteration
    from rollart.workers.client import connect
    from rollart.workers.devserver import DevServer

    run_dir = tmp_path / "run"
    config = tmp_path / "sim.toml"
    port = free_port()
    config.write_text(CONFIG.format(run_dir=run_dir, port=port, ui_port=free_port()))
    first = launch("--config", str(config))
    try:
        wait_for_iterations(first, run_dir, 2)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
    finally:
        stop(first)
    time.sleep(1)  # the dev server and workers die with their parent
    again = subprocess.run([sys.executable, "-m", "rollart.workers.cli", "train", "--config",
                            str(config)], capture_output=True, text=True, timeout=120)
    assert again.returncode != 0
    assert f"resume it with: rollart train --resume {run_dir}" in again.stderr
    log = tmp_path / "resumed.log"
    with log.open("w") as out:
        resumed = launch("--resume", str(run_dir), stdout=out)
        try:
            assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
        finally:
            stop(resumed)
    # not a terminal: progress is one plain line per iteration, from where the run resumed
    printed = [line for line in log.read_text().splitlines() if line.startswith("rollart iter=")]
    assert [int(line.split()[1].removeprefix("iter=")) for line in printed] == list(range(
        int(printed[0].split()[1].removeprefix("iter=")), 6))
    status = json.loads((run_dir / "status.json").read_text())
    ledger = status["ledger"]
    assert status["iteration"] == 6
    assert ledger["started"] == ledger["trained"] + ledger["failed"] + ledger["evicted"]
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == list(range(6))

    async def audit() -> dict[int, list[str]]:
        from rollart.config import TemporalConfig

        client = await connect(TemporalConfig(address=f"127.0.0.1:{port}"))
        return await trained_ids_by_iteration(client, "rollart-train-run")

    with DevServer(run_dir / "temporal.db", port, None):
        batches = asyncio.run(audit())
    trained = [tid for ids in batches.values() for tid in ids]
    assert sorted(batches) == list(range(6)) and len(trained) == len(set(trained))
    assert len(trained) == ledger["trained"]


def test_a_replica_killed_mid_turn_is_not_pinged_its_turns_go_on_elsewhere(tmp_path):
    """Two replicas; one is SIGKILLed while it serves turns. Each lost turn is sent again once
    its heartbeat lapses, without a ping to the dead replica first (that ping waited out its
    own timeout, 10 s, before the turn could move), and nothing fails."""
    from temporalio.api.enums.v1 import EventType, TimeoutType

    from rollart.config import TemporalConfig
    from rollart.workers.client import connect
    from rollart.workers.devserver import DevServer

    run_dir = tmp_path / "run"
    config = tmp_path / "sim.toml"
    port = free_port()
    text = CONFIG.format(run_dir=run_dir, port=port, ui_port=free_port())
    # long turns (each action stands for 1,024 simulated tokens): the kill finds some in flight
    text = text.replace("time_scale = 0.02", "time_scale = 0.02\ntoken_scale = 1024")
    text = text.replace('hardware = "h800"', 'hardware = "h800"\nreplicas = 2')
    config.write_text(text.replace("iterations = 6", "iterations = 3"))
    launcher = launch("--config", str(config))
    try:
        wait_for_iterations(launcher, run_dir, 1)
        os.killpg(worker_pid(launcher, "gen --pool h800 --replica 0"), signal.SIGKILL)
        assert launcher.wait(timeout=300) == 0, launcher.stderr.read()
    finally:
        stop(launcher)
    status = json.loads((run_dir / "status.json").read_text())
    assert status["ledger"]["failed"] == 0

    async def activities() -> tuple[int, int]:
        client = await connect(TemporalConfig(address=f"127.0.0.1:{port}"))
        silent, pings = 0, 0
        async for execution in client.list_workflows("WorkflowType='TrajectoryWorkflow'"):
            history = await client.get_workflow_handle(execution.id).fetch_history()
            for event in history.events:
                if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT:
                    failure = event.activity_task_timed_out_event_attributes.failure
                    silent += (failure.timeout_failure_info.timeout_type
                               == TimeoutType.TIMEOUT_TYPE_HEARTBEAT)
                elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    pings += event.activity_task_scheduled_event_attributes.activity_type.name \
                        == "gen.ping"
        return silent, pings

    with DevServer(run_dir / "temporal.db", port, None):
        silent, pings = asyncio.run(activities())
    assert silent > 0, "the kill found no turn in flight: the test checked nothing"
    assert pings == 0
