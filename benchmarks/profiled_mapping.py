"""Static vs profiled domain -> pool mapping on a workload whose answers lengthen in training.

Simulated compute (system figures): one H800 replica (compute pool) and three H20 replicas
(bandwidth pool), equal in cost to the hardware mix of benchmarks/simulated.py. Two domains train
with one policy: FrozenLake (multi-turn, prefill-heavy) and arithmetic answers (one turn, long
prompts: sums of 8 three-digit numbers). Both start on the compute pool, each may use the
other; that is the right call at first, while answers are short (a prompt prefills 6.7x faster
on an H800 than on an H20), and goes stale as answers lengthen with every policy version
(`simulation.answer_growth`, as reasoning grows during RL). Static keeps the configured mapping;
profiled runs with `routing.remap` and lets the online profiler move a domain. Sync training, so
each iteration's rollout time is the generation work of its batch. Compared: the mean rollout
seconds of the last half of the iterations, and what the profiler predicted for them.

Run: .venv/bin/python benchmarks/profiled_mapping.py [--iterations 12] [--smoke]
(writes results/profiled_mapping.json and profiled_mapping.md beside this file and merges
`profiled_vs_static_step_time` into results/suffix_decoding.json; --smoke: 2 iterations each,
nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from pathlib import Path

from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from simulated import base_config

from rollart.config import with_overrides
from rollart.contracts import TrainingStatus
from rollart.servers import free_port
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow

TIME_SCALE = 0.1
REPLICAS = {"h800": 1, "h20": 3}
ANSWER_TOKEN_SCALE = 8  # simulated tokens per answer digit at version 0 ...
ANSWER_GROWTH = 1.0  # ... and 8 more with every version
DOMAINS = {
    "frozenlake": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 8},
    "arithmetic": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 1,
                   "kwargs": {"digits": 3, "terms": 8}},
}
MAPPINGS = {"static": {"routing.remap": False}, "profiled": {"routing.remap": True}}
HERE = Path(__file__).parent
console = Console()


async def run(iterations: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rollart-profile-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    config = base_config(server, work, REPLICAS, DOMAINS, **{
        "simulation.time_scale": TIME_SCALE,
        "simulation.answer_token_scale": ANSWER_TOKEN_SCALE,
        "simulation.answer_growth": ANSWER_GROWTH,
        "algorithm.iterations": iterations, "algorithm.mode": "sync",
        "routing.remap_patience": 2})
    results = {}
    try:
        async with in_process_fleet(config) as client:
            with Progress(console=console) as progress:
                task = progress.add_task("mappings", total=len(MAPPINGS))
                for name, overrides in MAPPINGS.items():
                    progress.update(task, description=f"training ({name})")
                    run_config = with_overrides(config, **overrides, run_dir=str(work / name))
                    status = await client.execute_workflow(
                        TrainingWorkflow.run, TrainingInput(config=run_config),
                        id=f"profile-{name}", task_queue=config.temporal.control_queue,
                        result_type=TrainingStatus)
                    results[name] = [{
                        "iteration": m.iteration, "rollout_s": m.rollout_s,
                        "rollout_simulated_s": m.rollout_s / TIME_SCALE,
                        "mapping": m.profile.mapping if m.profile else None,
                        "recommended": m.profile.recommended if m.profile else None,
                        "predicted_s": m.profile.predicted_s if m.profile else None,
                        "remapped": m.profile.remapped if m.profile else False,
                        "answer_tokens": m.domains["arithmetic"].generated_tokens
                        / max(m.domains["arithmetic"].trajectories, 1)
                        if "arithmetic" in m.domains else None,
                    } for m in status.history]
                    progress.advance(task)
    finally:
        server.stop()
    return results


def summarize(results: dict, iterations: int) -> dict:
    late = iterations // 2

    def late_rollout(name: str) -> float:
        return statistics.fmean(r["rollout_simulated_s"] for r in results[name][late:])

    remaps = [r["iteration"] for r in results["profiled"] if r["remapped"]]
    return {"profiled_vs_static_step_time": late_rollout("static") / late_rollout("profiled"),
            "late_rollout_simulated_s": {name: late_rollout(name) for name in results},
            "remapped_at_iterations": remaps,
            "setup": {"replicas": REPLICAS, "domains": DOMAINS, "time_scale": TIME_SCALE,
                      "answer_token_scale": ANSWER_TOKEN_SCALE, "answer_growth": ANSWER_GROWTH,
                      "iterations": iterations, "late_iterations_from": late},
            "runs": results}


def report(summary: dict, args: argparse.Namespace) -> None:
    runs = summary["runs"]
    columns = ["iteration", "static rollout s", "profiled rollout s", "profiled: arithmetic on",
               "predicted s (profiled)", "remapped"]
    table = Table(title="static vs profiled mapping, answers lengthening (simulated compute)")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for static, profiled in zip(runs["static"], runs["profiled"], strict=False):
        predicted = profiled["predicted_s"]
        row = [str(static["iteration"]), f"{static['rollout_simulated_s']:.1f}",
               f"{profiled['rollout_simulated_s']:.1f}",
               (profiled["mapping"] or {}).get("arithmetic", "-"),
               "-" if predicted is None else f"{predicted / TIME_SCALE:.1f}",
               "yes" if profiled["remapped"] else ""]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    ratio = summary["profiled_vs_static_step_time"]
    console.print(f"profiled vs static, rollout of iterations {args.iterations // 2}+: "
                  f"{ratio:.2f}x")
    if args.smoke:
        return
    save("profiled_mapping", summary, "Static vs profiled domain -> pool mapping",
         f".venv/bin/python benchmarks/profiled_mapping.py --iterations {args.iterations}",
         ["System figures (simulated compute, time scale "
          f"{TIME_SCALE} wall s per simulated s; seconds below are simulated). 1 H800 + 3 H20 "
          "replicas; FrozenLake (up to 8 turns) and arithmetic answers (sums of 8 three-digit "
          "numbers) with one policy, both configured on the H800 with the H20 pool allowed; "
          f"answers lengthen by {ANSWER_GROWTH:.0%} of their first length per version "
          f"({ANSWER_TOKEN_SCALE} simulated tokens per answer digit at first). Sync training, "
          "batch 32 in groups of 8. `mapping` is where the profiled run sent arithmetic in "
          "that iteration; `predicted` is the profiler's generation time for that mapping.",
          "", *lines, "",
          f"Rollout of iterations {args.iterations // 2} on, profiled over static: "
          f"**{ratio:.2f}x** (static {summary['late_rollout_simulated_s']['static']:.1f} s, "
          f"profiled {summary['late_rollout_simulated_s']['profiled']:.1f} s); remapped at "
          f"iterations {summary['remapped_at_iterations']}."])
    recorded_path = HERE / "results" / "suffix_decoding.json"
    recorded = json.loads(recorded_path.read_text())
    recorded["profiled_vs_static_step_time"] = ratio
    recorded_path.write_text(json.dumps(recorded, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:  # the smallest run, 10x faster
        args.iterations, TIME_SCALE = 2, TIME_SCALE / 10
    measured = asyncio.run(run(args.iterations))
    report(summarize(measured, args.iterations), args)
