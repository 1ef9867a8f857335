"""What a user sees of the command line: a progress table that fits 80 columns, one plain line
per iteration in logs, and startup failures as one line naming the cause and the setting."""

from __future__ import annotations

import io
import subprocess
import sys

import pytest
from conftest import sample_metrics
from rich.console import Console

from rollart.contracts import Ledger, TrainingStatus
from rollart.servers import free_port
from rollart.workers.progress import iteration_line, progress_table


def test_the_progress_table_fits_80_columns_without_truncating():
    status = TrainingStatus(iteration=12, iterations=30, version=12, done=False,
                            ledger=Ledger(started=1000, trained=900, failed=3, evicted=50),
                            history=[sample_metrics(k) for k in range(12)], mode="async", alpha=1)
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=False).print(progress_table(status, 1234.5))
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    text = out.getvalue()
    assert "…" not in text and "170.2" in text and "-0.012" in text
    assert "frozenlake 0.80" in text and "arithmetic 0.45" in text


def test_an_iteration_is_one_plain_line_in_a_log():
    line = iteration_line(sample_metrics(3))
    assert line.startswith("rollart iter=3 reward=0.500 succ=0.62 step_s=170.2 idle=123.4")
    assert "succ[arithmetic]=0.45" in line and "failed[reward: RewardEndpointDown]=2" in line
    assert "\n" not in line


def test_without_vllm_a_run_says_which_build_to_install(tmp_path, monkeypatch):
    hide_vllm = ("import sys; sys.modules['vllm'] = None; "
                 "from rollart.workers.cli import main; sys.exit(main())")
    result = subprocess.run([sys.executable, "-c", hide_vllm, "train", "--run-dir",
                             str(tmp_path / "run")], capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "vLLM is not installed" in result.stderr and "'rollart[gpu]'" in result.stderr

    from rollart.config import RunConfig
    from rollart.workers.cli import _check_engine_installed

    monkeypatch.setitem(sys.modules, "vllm", None)
    with pytest.raises(SystemExit, match="vLLM is not installed"):
        _check_engine_installed(RunConfig(), "gen")
    _check_engine_installed(RunConfig(), "env")  # env, train and reward workers run without it
    _check_engine_installed(RunConfig(), "reward")
    simulated = RunConfig.model_validate({"simulation": {"enabled": True}, "pools": [
        {"name": "cpu", "role": role} for role in ("env", "reward", "train")] + [
        {"name": "cpu", "role": "gen", "hardware": "h800"}]})
    _check_engine_installed(simulated)


@pytest.mark.parametrize(("args", "words"), [
    (["train", "--config", "/nonexistent/run.toml"],
     "--config: cannot read /nonexistent/run.toml: No such file or directory"),
    (["train", "--config", "{bad}"], "is not valid TOML: "),
    (["train", "--set", "model.path=/", "--run-dir", "{tmp}/run"],
     "model.path: / is not a Hugging Face model directory (no config.json)"),
    (["start", "--set", "temporal.address=127.0.0.1:{port}"],
     "temporal.address: cannot reach a Temporal server at 127.0.0.1:"),
])
def test_a_startup_failure_is_one_line_naming_the_setting(tmp_path, args, words):
    bad = tmp_path / "bad.toml"
    bad.write_text('run_dir = "x"\n[algorithm\n')
    args = [a.format(bad=bad, tmp=tmp_path, port=free_port()) for a in args]
    result = subprocess.run([sys.executable, "-m", "rollart.workers.cli", *args],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert words in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) <= 2
    debug = subprocess.run([sys.executable, "-m", "rollart.workers.cli", *args, "--debug"],
                           capture_output=True, text=True, timeout=120)
    if args[0] == "start":  # an error of our own code: --debug shows where it came from
        assert "Traceback" in debug.stderr
