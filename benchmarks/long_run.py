"""A long default run, measured: does the rollout rate hold while the run and its store grow?

Runs `rollart train` as the README's command does, with `algorithm.iterations` raised (300 by
default), then reads its metrics: rollout turns/s (turns served per second of iteration wall
time) in windows of iterations, each against the first window, beside failed trajectories and
turns sent again. A system figure of the real stack; the policy learns meanwhile, which changes
how many turns an iteration holds but not what one turn costs.

Run: .venv/bin/python benchmarks/long_run.py [--iterations 300] [--window 25] [--smoke]
(writes results/long_run.json, long_run.md and results/long_run.png; --smoke: 2 iterations of a
tiny batch, nothing written)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from demo_frozenlake import train
from report import HERE, save

from rollart.contracts import IterationMetrics
from rollart.workers.progress import read_metrics, turns_per_s, turns_served


def windows(metrics: list[IterationMetrics], size: int) -> list[dict]:
    """Iteration 0 (engine warm-up, first rollout from nothing) is left out."""
    rows = []
    for start in range(1, len(metrics), size):
        chunk = metrics[start:start + size]
        rows.append({
            "iterations": [chunk[0].iteration, chunk[-1].iteration],
            "turns": turns_served(chunk),
            "seconds": sum(m.step_s for m in chunk),
            "turns_per_s": turns_per_s(chunk),
            "iteration_s": sum(m.step_s for m in chunk) / len(chunk),
            "success_mean": sum(m.success_rate for m in chunk) / len(chunk),
            "rerouted_turns": sum(d.rerouted_turns for m in chunk for d in m.domains.values()),
        })
    first = rows[0]["turns_per_s"] if rows else 0.0
    for row in rows:
        row["vs_first"] = row["turns_per_s"] / first if first else 0.0
    return rows


def plot(metrics: list[IterationMetrics], rows: list[dict], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, success) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    rate.plot([m.iteration for m in metrics[1:]], [turns_per_s([m]) for m in metrics[1:]],
              color="lightgrey", linewidth=1, label="iteration")
    rate.step([r["iterations"][0] for r in rows] + [rows[-1]["iterations"][1]],
              [r["turns_per_s"] for r in rows] + [rows[-1]["turns_per_s"]],
              where="post", label="window mean")
    rate.set_ylabel("rollout turns/s")
    rate.set_ylim(bottom=0)
    rate.legend()
    rate.grid(alpha=0.3)
    success.plot([m.iteration for m in metrics], [m.success_rate for m in metrics])
    success.set_ylabel("batch success rate")
    success.set_xlabel("iteration")
    success.grid(alpha=0.3)
    fig.suptitle("rollart train (embedded default), long run, 2-core CPU")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--window", type=int, default=25)
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args, extra = parser.parse_known_args()
    if not args.smoke:
        extra = ["--set", f"algorithm.iterations={args.iterations}", *extra]
    run = train(extra, args.smoke)
    metrics = read_metrics(Path(run["run_dir"]))
    rows = windows(metrics, 1 if args.smoke else args.window)
    results = {
        "iterations": len(metrics),
        "minutes_total": run["minutes_total"],
        "turns": turns_served(metrics),
        "early_turns_per_s": rows[0]["turns_per_s"],
        "late_turns_per_s": rows[-1]["turns_per_s"],
        "late_vs_early_turns_per_s": rows[-1]["vs_first"],
        "lowest_window_vs_first": min(r["vs_first"] for r in rows),
        "failed_trajectories": run["failed_trajectories"],
        "trajectories": run["trajectories"],
        "rerouted_turns": sum(r["rerouted_turns"] for r in rows),
        "cpu_ms_per_turn": run["cpu_ms_per_turn"],
        "windows": rows,
    }
    print(json.dumps({k: v for k, v in results.items() if k != "windows"}, indent=2))
    if args.smoke:
        return
    body = [
        f"One `rollart train` run of {len(metrics)} iterations, {results['turns']} turns, "
        f"{results['minutes_total']:.1f} minutes; failed trajectories "
        f"{results['failed_trajectories']}, turns sent again {results['rerouted_turns']}. "
        "Rollout turns/s = turns served / iteration wall time. System figures of the real stack.",
        "",
        "| iterations | turns | turns/s | vs first | s per iteration | success (mean) |",
        "|---|---:|---:|---:|---:|---:|",
        *(f"| {r['iterations'][0]}-{r['iterations'][1]} | {r['turns']} | "
          f"{r['turns_per_s']:.1f} | {r['vs_first']:.2f} | {r['iteration_s']:.1f} | "
          f"{r['success_mean']:.2f} |" for r in rows),
        "",
        f"Last window over the first: {results['late_vs_early_turns_per_s']:.2f}; lowest "
        f"window over the first: {results['lowest_window_vs_first']:.2f}. Curves in "
        "`results/long_run.png`.",
    ]
    save("long_run", results, "Long run: the rollout rate as the run grows",
         f".venv/bin/python benchmarks/long_run.py --iterations {args.iterations} "
         f"--window {args.window}", body)
    plot(metrics, rows, HERE / "results" / "long_run.png")


if __name__ == "__main__":
    main()
