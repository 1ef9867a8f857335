"""Every benchmark script runs in its --smoke mode, so that none can rot unnoticed between the
rare full runs; a smoke run must leave the recorded results under benchmarks/ as they were."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "report.py")


def snapshot() -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in BENCHMARKS.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_benchmark_smoke(script: Path) -> None:
    before = snapshot()
    process = subprocess.Popen([sys.executable, str(script.relative_to(ROOT)), "--smoke"],
                               cwd=ROOT)
    try:
        assert process.wait(timeout=300) == 0
    finally:
        if process.poll() is None:  # timed out: Ctrl-C, so it stops the servers it started
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
    assert snapshot() == before
