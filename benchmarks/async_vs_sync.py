"""Sync vs one-off vs async (alpha 1, 2) training under long-tail environment latency.

Side by side in one process, on one dev server (SQLite) and one vLLM engine: FrozenLake with
injected latency (lognormal env steps, a share of very slow resets), each mode trained until the
batch success rate reaches the target or the iteration cap. Throughput is trained trajectories
(and their sampled tokens) per second of run wall time; time-to-score is the wall time until the
first batch at the target. Ratios are to sync.

Weights go through local files, as when the results were first measured (before the Mooncake
store), so a rerun compares with them and needs no mooncake_master.

Run: .venv/bin/python benchmarks/async_vs_sync.py [--target 0.8] [--max-iterations 30] [--smoke]
(writes results/async_vs_sync.json and async_vs_sync.md beside this file; --smoke: every mode and
the scheduling comparison at the smallest sizes, nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rollart.config import load_config
from rollart.contracts import TrainingStatus, TrajectorySpec
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.servers import free_port
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

MODES = [("sync", {"algorithm.mode": "sync"}),
         ("one_off", {"algorithm.mode": "one_off"}),
         ("async1", {"algorithm.mode": "async", "algorithm.staleness": 1}),
         ("async2", {"algorithm.mode": "async", "algorithm.staleness": 2})]
LATENCY = {"step_median_s": 0.05, "step_sigma": 1.0, "slow_reset_share": 0.1,
           "slow_reset_s": 3.0}
console = Console()



async def run_mode(client, base: dict, name: str, overrides: dict) -> dict:
    config = load_config(None, **{**base, **overrides,
                                  "run_dir": str(Path(base["run_dir"]) / name)})
    started = time.perf_counter()
    handle = await client.start_workflow(
        TrainingWorkflow.run, TrainingInput(config=config), id=f"bench-{name}",
        task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    launched = (await handle.describe()).start_time
    status = await handle.result()
    wall = time.perf_counter() - started
    hit = next((m for m in status.history
                if m.success_rate >= config.algorithm.stop_at_success), None)
    return {
        "wall_s": wall,
        "iterations": status.iteration,
        "trained": status.ledger.trained,
        "evicted": status.ledger.evicted,
        "trajectories_per_s": status.ledger.trained / wall,
        "tokens_per_s": sum(m.generated_tokens for m in status.history) / wall,
        "time_to_score_s": (hit.ended_at - launched).total_seconds() if hit else None,
        "final_success": status.history[-1].success_rate,
        "trainer_idle_share": sum(m.trainer_idle_s for m in status.history)
        / max(sum(m.step_s for m in status.history), 1e-9),
        "lag_mean": sum(m.lag_mean for m in status.history) / len(status.history),
        "stale_token_share": sum(m.stale_token_share for m in status.history)
        / len(status.history),
    }


SCHEDULING_SIGMAS = {"low_variance": 0.25, "high_variance": 1.5}
SCHEDULING_TRAJECTORIES, SCHEDULING_TURNS = 32, 8
SMOKE = {"algorithm.group_size": 4, "algorithm.batch_size": 16, "algorithm.minibatches": 1,
         "algorithm.iterations": 2}
SMOKE_TRAJECTORIES, SMOKE_TURNS = 4, 2


async def scheduling(client, base: dict, trajectories: int, turns: int) -> dict:
    """Trajectory-level (one workflow per trajectory, each at its own pace) vs batch-level
    (lockstep turns) rollout of the same fixed-length episodes, as env latency variance grows."""
    results = {}
    for label, sigma in SCHEDULING_SIGMAS.items():
        latency = {"step_median_s": 0.05, "step_sigma": sigma}
        config = load_config(None, **{**base, "domains.frozenlake.faults": latency,
                                      "domains.frozenlake.env": "corridor",
                                      "domains.frozenlake.max_turns": turns})
        specs = [TrajectorySpec.for_domain(config, "frozenlake", f"sched-{label}-{kind}-{i}",
                                           "g", seed=i)
                 for kind in ("traj", "batch") for i in range(trajectories)]
        queue = config.temporal.control_queue
        started = time.perf_counter()
        await asyncio.gather(*(
            client.execute_workflow(TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                                    task_queue=queue)
            for spec in specs[:trajectories]))
        trajectory_s = time.perf_counter() - started
        started = time.perf_counter()
        await client.execute_workflow(BatchRolloutWorkflow.run, specs[trajectories:],
                                      id=f"sched-{label}-batch", task_queue=queue)
        batch_s = time.perf_counter() - started
        results[label] = {"step_sigma": sigma, "trajectory_level_s": trajectory_s,
                          "batch_level_s": batch_s, "ratio": batch_s / trajectory_s}
    return results


async def main(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rollart-async-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    engine = await PolicyEngine(resolve_model_path(None), load_config(None).engine).start()
    base = {"temporal.address": server.address, "run_dir": str(work),
            "algorithm.group_size": 8, "algorithm.batch_size": args.batch,
            "algorithm.iterations": args.max_iterations,
            "algorithm.stop_at_success": args.target, "domains.frozenlake.faults": LATENCY,
            "weights.backend": "local", **(SMOKE if args.smoke else {})}
    sizes = ((SMOKE_TRAJECTORIES, SMOKE_TURNS) if args.smoke
             else (SCHEDULING_TRAJECTORIES, SCHEDULING_TURNS))
    results = {}
    try:
        async with in_process_fleet(load_config(None, **base), engine) as client:
            results["scheduling"] = await scheduling(client, base, *sizes)
            if args.scheduling_only:
                return results
            with Progress(console=console) as progress:
                task = progress.add_task("modes", total=len(MODES))
                for name, overrides in MODES:
                    progress.update(task, description=f"training ({name})")
                    results[name] = await run_mode(client, base, name, overrides)
                    progress.advance(task)
    finally:
        engine.shutdown()
        server.stop()
    return results


SCHEDULING_HEADING = "## Trajectory- vs batch-level scheduling"


def scheduling_lines(sched: dict) -> list[str]:
    lines = [SCHEDULING_HEADING, "",
             f"{SCHEDULING_TRAJECTORIES} corridor episodes of {SCHEDULING_TURNS} turns, "
             "lognormal env steps (median 50 ms); batch-level = all trajectories take each turn "
             "together.", "",
             "| env step sigma | trajectory-level s | batch-level s | batch / trajectory |",
             "|---|---|---|---|"]
    lines += [f"| {r['step_sigma']} | {r['trajectory_level_s']:.1f} | {r['batch_level_s']:.1f} "
              f"| {r['ratio']:.2f} |" for r in sched.values()]
    return lines


def report(results: dict, args: argparse.Namespace) -> None:
    sched = results.pop("scheduling")
    console.print({label: round(r["ratio"], 2) for label, r in sched.items()})
    if args.scheduling_only and args.smoke:
        return
    if args.scheduling_only:  # keep the training comparison from the last full run
        here = Path(__file__).parent
        out = here / "results" / "async_vs_sync.json"
        summary = json.loads(out.read_text())
        summary["traj_vs_batch_ratio_high_variance"] = sched["high_variance"]["ratio"]
        summary["traj_vs_batch_ratio_low_variance"] = sched["low_variance"]["ratio"]
        summary["scheduling"] = sched
        out.write_text(json.dumps(summary, indent=2) + "\n")
        markdown = here / "async_vs_sync.md"
        kept = markdown.read_text().split(SCHEDULING_HEADING)[0].rstrip()
        markdown.write_text(kept + "\n\n" + "\n".join(scheduling_lines(sched)) + "\n")
        return
    sync = results["sync"]

    def ratio(name: str, key: str, invert: bool = False) -> float | None:
        a, b = results[name][key], sync[key]
        if a is None or b is None:
            return None
        return b / a if invert else a / b

    summary = {
        "traj_vs_batch_ratio_high_variance": sched["high_variance"]["ratio"],
        "traj_vs_batch_ratio_low_variance": sched["low_variance"]["ratio"],
        "scheduling": sched,
        "throughput_ratio_async1_vs_sync": ratio("async1", "trajectories_per_s"),
        "tts_ratio_async1_vs_sync": ratio("async1", "time_to_score_s", invert=True),
        "throughput_ratio_async2_vs_sync": ratio("async2", "trajectories_per_s"),
        "throughput_ratio_one_off_vs_sync": ratio("one_off", "trajectories_per_s"),
        "tts_ratio_one_off_vs_sync": ratio("one_off", "time_to_score_s", invert=True),
        "tts_ratio_async2_vs_sync": ratio("async2", "time_to_score_s", invert=True),
        "setup": {"batch_size": args.batch, "group_size": 8, "target": args.target,
                  "max_iterations": args.max_iterations, "latency": LATENCY},
        "modes": results,
    }
    table = Table(title="async vs sync, FrozenLake with long-tail env latency")
    columns = ["mode", "traj/s", "x sync", "tok/s", "time to score s", "x sync", "iters",
               "evicted", "idle share", "lag mean"]
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    for name, r in results.items():
        row = [name, fmt(r["trajectories_per_s"]), fmt(ratio(name, "trajectories_per_s")),
               fmt(r["tokens_per_s"], ".1f"), fmt(r["time_to_score_s"], ".0f"),
               fmt(ratio(name, "time_to_score_s", invert=True)), str(r["iterations"]),
               str(r["evicted"]), fmt(r["trainer_idle_share"]), fmt(r["lag_mean"])]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    if args.smoke:
        return
    save("async_vs_sync", summary, "Async vs sync",
         f".venv/bin/python benchmarks/async_vs_sync.py --target {args.target} "
         f"--max-iterations {args.max_iterations} --batch {args.batch}",
         [f"Env latency: {LATENCY}.", "", *lines, "", *scheduling_lines(sched)])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--max-iterations", type=int, default=30)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--scheduling-only", action="store_true",
                        help="only trajectory- vs batch-level scheduling; merged into the JSON")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    arguments = parser.parse_args()
    report(asyncio.run(main(arguments)), arguments)
