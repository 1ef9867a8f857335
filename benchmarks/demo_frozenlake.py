"""The embedded default, measured: real `rollart train` runs against the random-walk baseline.

Runs `rollart train` exactly as the README's command does (separate worker processes, dev server
on SQLite), several times one after another, since learning curves vary from run to run, then
reads each run's metrics and final status. Success is the share of the 64 sampled (temperature 1)
training episodes per iteration that reach the goal on the standard 4x4 map; time is measured
from the launch of `rollart train`. A learning figure: the real tiny model on real engines.

Run: .venv/bin/python benchmarks/demo_frozenlake.py [--runs 3] [--name NAME] [--smoke]
[extra rollart train args] (writes results/NAME.json and NAME.png, demo_frozenlake by default:
name a run whose train args differ from the default; --smoke: one run of 2 iterations of a tiny
batch, nothing written)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from rollart.contracts import TrainingStatus
from rollart.envs.frozenlake import random_walk_success
from rollart.servers import free_port
from rollart.workers.progress import read_metrics

HERE = Path(__file__).parent
TARGET = 0.8
SMOKE = {"algorithm.iterations": 2, "algorithm.batch_size": 16, "algorithm.group_size": 4,
         "algorithm.minibatches": 1}


def train(extra: list[str], smoke: bool) -> dict:
    """One `rollart train` run on free ports (so it can run beside a stack on the default
    ones), measured from its launch."""
    overrides = {"temporal.address": f"127.0.0.1:{free_port()}", "temporal.ui_port": free_port(),
                 "weights.mooncake_master": f"127.0.0.1:{free_port()}",
                 **(SMOKE if smoke else {})}
    run_dir = Path(tempfile.mkdtemp(prefix="rollart-demo-")) / "run"
    launched = datetime.now(UTC)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "rollart.workers.cli", "train", "--run-dir",
                    str(run_dir), *[arg for key, value in overrides.items()
                                    for arg in ("--set", f"{key}={value}")], *extra],
                   check=True)
    total_min = (time.perf_counter() - started) / 60
    metrics = read_metrics(run_dir)
    status = TrainingStatus.model_validate_json((run_dir / "status.json").read_text())
    cpu_file = run_dir / "cpu.json"
    cpu = json.loads(cpu_file.read_text()) if cpu_file.exists() else {"cpu_ms_per_turn": {}}
    reached = next((m for m in metrics if m.success_rate >= TARGET), None)
    return {
        "run_dir": str(run_dir),
        "success_initial": metrics[0].success_rate,
        "success_final": metrics[-1].success_rate,
        "success_best": max(m.success_rate for m in metrics),
        "iterations_to_target": reached.iteration if reached else None,
        "minutes_to_target": ((reached.ended_at - launched).total_seconds() / 60
                              if reached else None),
        "minutes_total": total_min,
        "iterations": len(metrics),
        "trajectories": status.ledger.model_dump(),
        "failed_trajectories": status.ledger.failed,
        "cpu_ms_per_turn": cpu["cpu_ms_per_turn"],
        "curve": [{"iteration": m.iteration, "success": m.success_rate,
                   "minutes": (m.ended_at - launched).total_seconds() / 60} for m in metrics],
    }


def summary(runs: list[dict]) -> dict:
    reached = [r["minutes_to_target"] for r in runs if r["minutes_to_target"] is not None]
    spread = ({"median": statistics.median(reached), "min": min(reached), "max": max(reached)}
              if reached else None)
    return {
        "random_walk_success": random_walk_success(100_000),
        "target": TARGET,
        "runs": len(runs),
        "runs_reaching_target": len(reached),
        "minutes_to_target": spread,
        "success_final": [r["success_final"] for r in runs],
        "minutes_total": [r["minutes_total"] for r in runs],
        "failed_trajectories": sum(r["failed_trajectories"] for r in runs),
        "evaluation": "share of the iteration's 64 sampled (T=1) training episodes that reach "
                      "the goal, standard 4x4 map, not slippery, <= 10 turns; minutes from the "
                      "launch of rollart train",
        "per_run": runs,
    }


def plot(runs: list[dict], out: Path, extra: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for k, run in enumerate(runs):
        ax.plot([p["minutes"] for p in run["curve"]], [p["success"] for p in run["curve"]],
                marker=".", label=f"run {k + 1}")
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("minutes since launch")
    ax.set_ylabel("batch success rate")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"rollart train ({' '.join(extra) or 'embedded default'}), FrozenLake 4x4, "
                 "2-core CPU", fontsize=9 if extra else None)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--name", default="demo_frozenlake",
                        help="results/NAME.json and NAME.png")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args, extra = parser.parse_known_args()
    runs = [train(extra, args.smoke) for _ in range(1 if args.smoke else args.runs)]
    result = summary(runs)
    print(json.dumps({k: v for k, v in result.items() if k != "per_run"}, indent=2))
    if args.smoke:
        return
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"{args.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(runs, HERE / "results" / f"{args.name}.png", extra)


if __name__ == "__main__":
    main()
