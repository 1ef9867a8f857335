"""Static vs profiled domain -> pool mapping on a workload whose answers lengthen in training.

Simulated compute (system figures): one H800 replica (compute pool) and three H20 replicas
(bandwidth pool), equal in cost to the hardware mix of benchmarks/simulated.py. Two domains train
with one policy: FrozenLake (multi-turn, prefill-heavy) and arithmetic answers (one turn, long
prompts: sums of 8 three-digit numbers). Both start on the compute pool, each may use the
other; that is the right call at first, while answers are short (a prompt prefills 6.7x faster
on an H800 than on an H20), and goes stale as answers lengthen with every policy version
(`simulation.answer_growth`, as reasoning grows during RL). Static keeps the configured mapping;
profiled runs with `routing.remap` and lets the online profiler move a domain. Sync training, so
each iteration's rollout time is mostly the generation work of its batch (env steps and
orchestration add the rest, which the profiler's prediction leaves out). Compared: the mean rollout
seconds of the last half of the iterations, and what the profiler predicted for them.

Run: .venv/bin/python benchmarks/profiled_mapping.py [--iterations 12] [--seeds 3] [--smoke]
(writes results/profiled_mapping.json and profiled_mapping.md beside this file and merges
`profiled_vs_static_step_time`, the mean over seeds, into results/suffix_decoding.json; about
22 minutes a seed, as simulated time runs at wall speed; --smoke: one seed, 2 iterations each,
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

TIME_SCALE = 1.0  # at 0.1 the 2-core machine's orchestration (~15 ms a turn) was 10x longer
REPLICAS = {"h800": 1, "h20": 3}
ANSWER_TOKEN_SCALE = 32  # simulated tokens per answer digit at version 0 ...
ANSWER_GROWTH = 1.0  # ... and 32 more with every version
DOMAINS = {
    "frozenlake": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 8},
    "arithmetic": {"gen_pool": "h800", "gen_fallback": ["h20"], "max_turns": 1,
                   "kwargs": {"digits": 3, "terms": 8}},
}
MAPPINGS = {"static": {"routing.remap": False}, "profiled": {"routing.remap": True}}
HERE = Path(__file__).parent
console = Console()


async def run(iterations: int, seed: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rollart-profile-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    config = base_config(server, work, REPLICAS, DOMAINS, **{
        "simulation.time_scale": TIME_SCALE,
        "simulation.answer_token_scale": ANSWER_TOKEN_SCALE,
        "simulation.answer_growth": ANSWER_GROWTH,
        "algorithm.iterations": iterations, "algorithm.mode": "sync", "model.seed": seed,
        "algorithm.rollout_unit": "trajectory",
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
                        id=f"profile-{name}-{seed}", task_queue=config.temporal.control_queue,
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


def summarize(by_seed: dict[int, dict], iterations: int) -> dict:
    seeds = {seed: summarize_seed(results, iterations) for seed, results in by_seed.items()}
    ratios = [s["profiled_vs_static_step_time"] for s in seeds.values()]
    first = seeds[min(seeds)]
    return {"profiled_vs_static_step_time": statistics.fmean(ratios),
            "profiled_vs_static_step_time_range": [min(ratios), max(ratios)],
            "remaps_per_run": [len(s["remapped_at_iterations"]) for s in seeds.values()],
            "setup": first["setup"], "seeds": seeds}


def summarize_seed(results: dict, iterations: int) -> dict:
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
    first_seed = min(summary["seeds"])
    runs = summary["seeds"][first_seed]["runs"]
    columns = ["iteration", "static rollout s", "profiled rollout s",
               "profiled: frozenlake, arithmetic on",
               "predicted s (profiled)", "remapped"]
    table = Table(title="static vs profiled mapping, answers lengthening (simulated compute)")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for static, profiled in zip(runs["static"], runs["profiled"], strict=False):
        predicted = profiled["predicted_s"]
        row = [str(static["iteration"]), f"{static['rollout_simulated_s']:.1f}",
               f"{profiled['rollout_simulated_s']:.1f}",
               ", ".join((profiled["mapping"] or {}).get(d, "-") for d in DOMAINS),
               "-" if predicted is None else f"{predicted / TIME_SCALE:.1f}",
               "yes" if profiled["remapped"] else ""]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    ratio = summary["profiled_vs_static_step_time"]
    low, high = summary["profiled_vs_static_step_time_range"]
    per_seed = [
        f"seed {seed}: {s['profiled_vs_static_step_time']:.2f}x (static "
        f"{s['late_rollout_simulated_s']['static']:.1f} s, profiled "
        f"{s['late_rollout_simulated_s']['profiled']:.1f} s), remapped at iterations "
        f"{s['remapped_at_iterations']}" for seed, s in summary["seeds"].items()]
    console.print(f"profiled vs static, rollout of iterations {args.iterations // 2}+: "
                  f"{ratio:.2f}x (seeds {low:.2f}-{high:.2f})", *per_seed, sep="\n")
    if args.smoke:
        return
    save("profiled_mapping", summary, "Static vs profiled domain -> pool mapping",
         f".venv/bin/python benchmarks/profiled_mapping.py --iterations {args.iterations} "
         f"--seeds {args.seeds}",
         ["System figures (simulated compute, time scale "
          f"{TIME_SCALE} wall s per simulated s; seconds below are simulated). 1 H800 + 3 H20 "
          "replicas; FrozenLake (up to 8 turns) and arithmetic answers (sums of 8 three-digit "
          "numbers) with one policy, both configured on the H800 with the H20 pool allowed; "
          f"answers lengthen by {ANSWER_GROWTH:.0%} of their first length per version "
          f"({ANSWER_TOKEN_SCALE} simulated tokens per answer digit at first). Sync training, "
          "batch 32 in groups of 8. The mapping column is where the profiled run sent each "
          "domain in that iteration; `predicted` is the profiler's generation time for it. "
          f"The table is seed {first_seed}'s run.",
          "", *lines, "",
          f"Rollout of iterations {args.iterations // 2} on, profiled over static: "
          f"**{ratio:.2f}x** mean over {len(per_seed)} seeds ({low:.2f}-{high:.2f}):", "",
          *(f"- {line}" for line in per_seed)])
    recorded_path = HERE / "results" / "suffix_decoding.json"
    recorded = json.loads(recorded_path.read_text())
    recorded["profiled_vs_static_step_time"] = ratio
    recorded_path.write_text(json.dumps(recorded, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--seeds", type=int, default=3, help="one run per seed 0..N-1")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:  # the smallest run, 10x faster
        args.iterations, args.seeds, TIME_SCALE = 2, 1, TIME_SCALE / 10
    measured = {seed: asyncio.run(run(args.iterations, seed)) for seed in range(args.seeds)}
    report(summarize(measured, args.iterations), args)
