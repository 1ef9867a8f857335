"""The embedded stack's accounting of where the CPU goes, on real processes."""

from __future__ import annotations

import sys
import time

from rollart.config import load_config
from rollart.workers.progress import write_cpu_budget
from rollart.workers.stack import Stack

SPIN = "import time\nend = time.process_time() + {s}\nwhile time.process_time() < end: pass\n"


def test_cpu_is_counted_per_process_and_its_children(tmp_path):
    config = load_config(None, run_dir=str(tmp_path), **{"weights.backend": "local"})
    stack = Stack(config, tmp_path / "config.json", start_server=False)
    parent = (f"import subprocess, sys\n{SPIN.format(s=0.3)}"
              f"subprocess.run([sys.executable, '-c', {SPIN.format(s=0.6)!r}])\n")
    stack.commands = {"busy": [sys.executable, "-c", parent]}
    stack.logs.mkdir(parents=True)
    stack.spawn("busy")
    seen: dict[str, float] = {}
    while stack.processes["busy"].poll() is None:
        seen = stack.cpu_seconds()
        time.sleep(0.05)
    assert 0.25 <= seen["busy"] <= 1.0
    child = next(name for name in seen if name.startswith("busy "))
    assert 0.5 <= seen[child] <= 1.5, seen  # the child's last reading survives its exit


def test_cpu_budget_is_per_served_turn(tmp_path):
    from datetime import UTC, datetime

    from rollart.contracts import IterationMetrics, ReplicaMetrics

    metrics = [IterationMetrics(
        iteration=i, ended_at=datetime.now(UTC), version=i, reward_mean=0, success_rate=0,
        trajectories=8, generated_tokens=0, rollout_s=1, train_s=1, weight_update_s=0,
        step_s=2, tokens_per_s=0, loss=0, replicas={"r0": ReplicaMetrics(requests=50)})
        for i in range(2)]
    line = write_cpu_budget({"server": 2.0, "control": 0.5}, metrics, tmp_path / "cpu.json")
    assert line.startswith("CPU per turn, start-up included (100 turns, ms): server 20.0, "
                           "control 5.0")
    assert write_cpu_budget({}, metrics, tmp_path / "none.json") == ""


def test_a_worker_that_exits_is_restarted_and_a_crash_loop_stops_the_run(tmp_path):
    import pytest

    from rollart.workers.stack import CrashLoopError

    config = load_config(None, run_dir=str(tmp_path), **{
        "weights.backend": "local", "supervisor.max_restarts": 2, "supervisor.backoff_s": 1.0,
        "supervisor.window_s": 60.0})
    stack = Stack(config, tmp_path / "config.json", start_server=False)
    stack.commands = {"flaky": [sys.executable, "-c", "import sys; sys.exit(3)"],
                      "steady": [sys.executable, "-c", "import time; time.sleep(60)"]}
    stack.logs.mkdir(parents=True)
    for name in stack.commands:
        stack.spawn(name)
    try:
        stack.processes["flaky"].wait()
        first = stack.processes["flaky"]
        stack.supervise(now=100.0)  # exit seen: restart due after the 1 s backoff
        assert stack.processes["flaky"] is first and stack.restart_count == 1
        stack.supervise(now=100.5)
        assert stack.processes["flaky"] is first
        stack.supervise(now=101.0)  # started again
        assert stack.processes["flaky"] is not first
        stack.processes["flaky"].wait()
        stack.supervise(now=102.0)  # second exit: backoff doubles
        assert stack.exits[-1]["restart_in_s"] == 2.0
        stack.supervise(now=104.0)
        stack.processes["flaky"].wait()
        with pytest.raises(CrashLoopError, match=r"worker flaky exited with 3 after 2 restarts "
                                                 r"within 60 s .*flaky\.log"):
            stack.supervise(now=105.0)
        assert stack.processes["steady"].poll() is None  # the others were left alone
        stack.write_supervision(tmp_path / "supervisor.json")
        assert '"worker_restarts": 2' in (tmp_path / "supervisor.json").read_text()
    finally:
        stack.stop()
