"""The embedded default, measured: a real `rollart train` run against the random-walk baseline.

Runs `rollart train` exactly as the README's command does (separate worker processes, dev server
on SQLite), then reads its metrics. Success is the share of the 64 sampled (temperature 1) training
episodes per iteration that reach the goal on the standard 4x4 map.

Run: .venv/bin/python benchmarks/demo_frozenlake.py [--smoke] [extra rollart train args]
(writes results/demo_frozenlake.json and demo_frozenlake.png; --smoke: 2 iterations of a tiny
batch, nothing written)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rollart.envs.frozenlake import random_walk_success
from rollart.workers.devserver import free_port
from rollart.workers.progress import read_metrics

HERE = Path(__file__).parent
TARGET = 0.8


def smoke_args() -> list[str]:
    """A tiny run on free ports, so that it can run beside a stack on the default ones."""
    overrides = {"algorithm.iterations": 2, "algorithm.batch_size": 16,
                 "algorithm.group_size": 4, "algorithm.minibatches": 1,
                 "temporal.address": f"127.0.0.1:{free_port()}",
                 "temporal.ui_port": free_port(),
                 "weights.mooncake_master": f"127.0.0.1:{free_port()}"}
    return [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args, train_args = parser.parse_known_args()
    run_dir = Path(tempfile.mkdtemp(prefix="rollart-demo-")) / "run"
    launched = datetime.now(UTC)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rollart.workers.cli", "train", "--run-dir",
                    str(run_dir), *(smoke_args() if args.smoke else []), *train_args], check=True)
    total_min = (time.perf_counter() - started) / 60
    metrics = read_metrics(run_dir)
    reached = next((m for m in metrics if m.success_rate >= TARGET), None)
    result = {
        "random_walk_success": random_walk_success(100_000),
        "success_initial": metrics[0].success_rate,
        "success_final": metrics[-1].success_rate,
        "success_best": max(m.success_rate for m in metrics),
        "target": TARGET,
        "iterations_to_target": reached.iteration if reached else None,
        "minutes_to_target": ((reached.ended_at - launched).total_seconds() / 60
                              if reached else None),
        "minutes_total": total_min,
        "iterations": len(metrics),
        "evaluation": "share of the iteration's 64 sampled (T=1) training episodes that reach "
                      "the goal, standard 4x4 map, not slippery, <= 10 turns",
        "curve": [{"iteration": m.iteration, "success": m.success_rate,
                   "minutes": (m.ended_at - launched).total_seconds() / 60} for m in metrics],
    }
    print(json.dumps({k: v for k, v in result.items() if k != "curve"}, indent=2))
    if args.smoke:
        return
    out = HERE / "results" / "demo_frozenlake.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if (run_dir / "curve.png").exists():
        (HERE / "results" / "demo_frozenlake.png").write_bytes((run_dir / "curve.png").read_bytes())


if __name__ == "__main__":
    main()
