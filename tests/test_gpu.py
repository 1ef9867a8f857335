"""The GPU path, where a CUDA device exists: the prepared check (benchmarks/gpu_check.py) runs
generation on it with a weight update and a train step, and the engine's logprobs agree with
the trainer's. Without a GPU it is skipped; CI runs the same script on CPU in its smoke mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).parent.parent


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_generation_on_the_gpu_agrees_with_the_trainer_after_an_update(dtype, tmp_path):
    out = tmp_path / "gpu_check.json"
    process = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--dtype", dtype,
                              "--out", str(out)], cwd=ROOT, timeout=600)
    assert process.returncode == 0
    results = json.loads(out.read_text())
    assert results["agree"] and results["cuda"]
    assert results["dtype"] == dtype
    assert results["max_logprob_gap_after_update_vs_old_weights"] > results["tolerance"]
    megatron = results["megatron_core"]  # the megatron-core backend's step, served back
    assert megatron["checked"] and megatron["agree"] and megatron["versions_served"] == [2]
