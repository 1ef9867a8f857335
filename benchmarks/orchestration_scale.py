"""How far orchestration scales on one machine, and what RollArt's production scale needs.

The embedded stack as `rollart train` starts it (a real dev server on SQLite, one process per
fleet worker) on simulated compute with a negligible cost model, so every second and every CPU
second measured is orchestration: Temporal, the workflows, the router, the activities' own work.
Concurrent 10-turn corridor trajectories go from a hundred to a thousand at once; per level:
turns/s, per-turn latency, CPU per turn of every process, history events per trajectory. Then
the cost of one continue-as-new (a small state and a TrainingWorkflow-sized one), and from the
figures a projection for 512 trajectories per batch, 48 turns, a turn every 3 s. System figures,
simulated compute; on 2 cores every process shares the same CPUs, so the limit found is this
machine's, and the projection scales its CPU per turn.

Run: .venv/bin/python benchmarks/orchestration_scale.py [--levels 100 300 1000] [--turns 10]
[--smoke] (writes results/orchestration_scale.json and orchestration_scale.md; --smoke runs toy
sizes and writes nothing)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path

from report import save
from rich.console import Console
from rich.table import Table
from temporalio import workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollart.config import RunConfig, load_config
from rollart.contracts import TrajectoryResult, TrajectorySpec
from rollart.servers import free_port
from rollart.workers.client import connect
from rollart.workers.stack import Stack
from rollart.workflows.trajectory import TrajectoryWorkflow

console = Console()
PRODUCTION = {"batch": 512, "turns": 48, "turn_s": 3.0, "in_flight_batches": 2,
              "redundancy_share": 0.25}
PLANNING_WRITES_PER_SHARD = 100  # per second on Postgres; the figure infra/temporal assumes
SHARD_WRITES_PER_TURN = 10  # two activities: ~6 history events and 2 workflow tasks


@workflow.defn(name="BenchHops", sandboxed=False)
class Hops:
    """`hops` waits of `hop_s`, each in a run of its own (continue-as-new, carrying `state`, the
    TrainingWorkflow's way) or all in one run: the difference is what continue-as-new costs.
    Runs last longer than the server's minimal interval between a workflow id's runs (1 s by
    default), which delays any run that continues sooner."""

    @workflow.run
    async def run(self, hops: int, state: str, hop_s: float, chain: bool) -> int:
        if hops == 0:
            return 0
        if chain:
            await workflow.sleep(timedelta(seconds=hop_s))
            workflow.continue_as_new(args=[hops - 1, state, hop_s, True])
        for _ in range(hops):
            await workflow.sleep(timedelta(seconds=hop_s))
        return hops


def scale_config(work: Path, turns: int) -> RunConfig:
    return load_config(None, **{
        "run_dir": str(work / "run"), "temporal.address": f"127.0.0.1:{free_port()}",
        "temporal.ui_port": free_port(), "weights.backend": "local",
        "simulation.enabled": True, "simulation.time_scale": 1e-6,
        "engine.max_num_seqs": 512,
        "pools": [{"name": "cpu", "role": "env", "concurrency": 512},
                  {"name": "cpu", "role": "reward", "concurrency": 256},
                  {"name": "cpu", "role": "train"},
                  {"name": "h800", "role": "gen", "hardware": "h800"}],
        "domains.frozenlake.gen_pool": "h800", "domains.frozenlake.max_turns": turns})


def spec(config: RunConfig, tid: str, turns: int) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, "frozenlake", tid, tid, seed=0).model_copy(
        update={"env_name": "corridor", "max_turns": turns})


async def level(client, stack: Stack, config: RunConfig, count: int, turns: int,
                name: str) -> dict:
    queue = config.temporal.control_queue
    before, started = stack.cpu_seconds(), time.perf_counter()
    results = await asyncio.gather(*(
        client.execute_workflow(TrajectoryWorkflow.run, spec(config, f"{name}-{i}", turns),
                                id=f"{name}-{i}", task_queue=queue,
                                result_type=TrajectoryResult)
        for i in range(count)))
    wall = time.perf_counter() - started
    after = stack.cpu_seconds()
    served = sum(r.turns for r in results)
    cpu = {process: (seconds - before.get(process, 0.0)) for process, seconds in after.items()}
    history = await client.get_workflow_handle(f"{name}-0").fetch_history()
    return {
        "trajectories": count, "turns": served, "failed": sum(r.status != "completed"
                                                              for r in results),
        "turns_per_s": served / wall, "wall_s": wall,
        "turn_latency_ms": 1000 * wall / turns,
        "cpu_ms_per_turn": {p: 1000 * s / served for p, s in
                            sorted(cpu.items(), key=lambda item: -item[1]) if s > 0},
        "cpu_cores_used": sum(cpu.values()) / wall,
        "history_events_per_trajectory": len(history.events),
    }


async def continue_as_new_cost(client, hops: int, hop_s: float = 1.5) -> dict:
    """ms per continue-as-new over the same waits in one run, with a small state and a ~200 KB
    one (a TrainingWorkflow's order)."""
    costs = {}
    async with Worker(client, task_queue="bench.hops", workflows=[Hops],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        for label, size in (("small_state", 100), ("state_200kb", 200_000)):
            walls = []
            for chain in (False, True):
                started = time.perf_counter()
                await client.execute_workflow(
                    Hops.run, args=[hops, "x" * size, hop_s, chain],
                    id=f"hops-{label}-{chain}", task_queue="bench.hops")
                walls.append(time.perf_counter() - started)
            costs[label] = 1000 * (walls[1] - walls[0]) / hops
    return costs


def projection(best: dict, low_load: dict) -> dict:
    """What RollArt's production scale needs, from this machine's CPU per turn."""
    p = PRODUCTION
    in_flight = p["in_flight_batches"] * p["batch"] * (1 + p["redundancy_share"])
    turns_per_s = in_flight / p["turn_s"]
    cpu = best["cpu_ms_per_turn"]

    def cores(prefix: str) -> float:
        return sum(ms for name, ms in cpu.items() if name.startswith(prefix)) * turns_per_s / 1e3

    writes = turns_per_s * SHARD_WRITES_PER_TURN
    overhead_s = low_load["turn_latency_ms"] / 1e3
    return {
        "trajectories_in_flight": in_flight, "turns_per_s": turns_per_s,
        "temporal_server_cores": cores("temporal dev server"),
        "control_worker_cores": cores("control"), "env_worker_cores": cores("env"),
        "generation_frontend_cores": cores("gen"), "reward_worker_cores": cores("reward"),
        "shard_writes_per_s": writes,
        "history_shards_busy": writes / PLANNING_WRITES_PER_SHARD,
        "history_shards": 512,
        "orchestration_share_of_a_turn": overhead_s / (overhead_s + p["turn_s"]),
        "basis": "CPU ms per turn measured here (dev server on SQLite, 2 cores) times the "
                 "production turn rate; a Postgres-backed cluster's frontend, history and "
                 "matching spend differently, so server cores are an order of magnitude",
    }


async def main(args: argparse.Namespace) -> dict:
    levels = [1, *([4, 8] if args.smoke else args.levels)]  # 1: latency without queueing
    turns = 3 if args.smoke else args.turns
    work = Path(tempfile.mkdtemp(prefix="rollart-scale-"))
    config = scale_config(work, turns)
    config_file = work / "config.json"
    config_file.write_text(config.model_dump_json())
    results: dict = {"turns_per_trajectory": turns, "levels": {}}
    with Stack(config, config_file) as stack:
        client = await connect(config.temporal)
        with console.status("the stack is starting"):
            await level(client, stack, config, 2, 2, "warm")
        for count in levels:
            console.print(f"{count} concurrent trajectories of {turns} turns")
            results["levels"][str(count)] = await level(client, stack, config, count, turns,
                                                        f"scale{count}")
        results["continue_as_new_cost_ms"] = await continue_as_new_cost(
            client, 2 if args.smoke else 6, 1.2 if args.smoke else 1.5)
    figures = list(results["levels"].values())
    best = max(figures, key=lambda f: f["turns_per_s"])
    results["max_turns_per_s"] = best["turns_per_s"]
    results["max_concurrent_trajectories"] = max(f["trajectories"] for f in figures
                                                 if f["failed"] == 0)
    top = next(iter(best["cpu_ms_per_turn"]))
    results["bottleneck"] = (
        f"CPU: {best['cpu_cores_used']:.2f} of the machine's 2 cores busy at the best level; "
        f"the largest share is the {top} ({best['cpu_ms_per_turn'][top]:.1f} ms per turn of "
        f"{sum(best['cpu_ms_per_turn'].values()):.1f})")
    results["projection"] = projection(best, results["levels"]["1"])
    return results


def report(results: dict, args: argparse.Namespace) -> None:
    table = Table(title="orchestration scale (2-core CPU, dev server on SQLite, simulated "
                        "compute)")
    for column in ("trajectories", "turns/s", "turn latency (ms)", "cores busy",
                   "server ms/turn", "control ms/turn", "events/trajectory"):
        table.add_column(column, justify="right")
    lines = ["| trajectories at once | turns/s | turn latency (ms) | cores busy | dev server "
             "CPU ms/turn | control worker CPU ms/turn | history events per trajectory |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for count, f in results["levels"].items():
        cpu = f["cpu_ms_per_turn"]
        row = [count, f"{f['turns_per_s']:.1f}", f"{f['turn_latency_ms']:.0f}",
               f"{f['cpu_cores_used']:.2f}", f"{cpu.get('temporal dev server', 0):.1f}",
               f"{cpu.get('control', 0):.1f}", str(f["history_events_per_trajectory"])]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    can = results["continue_as_new_cost_ms"]
    console.print(f"continue-as-new: {can}; bottleneck: {results['bottleneck']}")
    console.print(results["projection"])
    if args.smoke:
        return
    p = results["projection"]
    body = [
        "System figures on simulated compute (a negligible cost model): everything measured is "
        "orchestration. Each level starts that many 10-turn corridor trajectories at once and "
        "waits for all of them.", "", *lines, "",
        f"- max_turns_per_s: {results['max_turns_per_s']:.1f}; max_concurrent_trajectories "
        f"(every one completed): {results['max_concurrent_trajectories']}",
        f"- bottleneck: {results['bottleneck']}",
        f"- continue-as-new, ms per hop: {can['small_state']:.1f} with a small state, "
        f"{can['state_200kb']:.1f} carrying 200 KB (over the same waits in one run; a run that "
        "continues within 1 s of its start also waits out the server's minimal interval "
        "between a workflow id's runs)",
        "", "## Projection: RollArt's production scale",
        f"512 trajectories per batch, 48 turns, a turn every 3 s, two batches in flight with 25% "
        f"redundancy: {p['trajectories_in_flight']:.0f} trajectories, {p['turns_per_s']:.0f} "
        "turns/s.", "",
        f"- Temporal server: ~{p['temporal_server_cores']:.1f} cores at this dev server's CPU "
        f"per turn; {p['shard_writes_per_s']:.0f} shard writes/s keep "
        f"~{p['history_shards_busy']:.0f} shards busy at {PLANNING_WRITES_PER_SHARD} writes/s "
        f"each: {p['history_shards']} shards (infra/temporal/values.yaml).",
        f"- control workers: ~{p['control_worker_cores']:.1f} cores; env workers' "
        f"orchestration: ~{p['env_worker_cores']:.1f}; generation frontends: "
        f"~{p['generation_frontend_cores']:.1f}; reward: ~{p['reward_worker_cores']:.1f}.",
        f"- orchestration's share of a 3 s turn: {100 * p['orchestration_share_of_a_turn']:.1f}%"
        " (this machine's per-turn latency of one trajectory alone, on simulated compute).",
        f"- basis: {p['basis']}.",
    ]
    save("orchestration_scale", results, "Orchestration scale",
         "python benchmarks/orchestration_scale.py", body)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--smoke", action="store_true")
    return parser.parse_args()


if __name__ == "__main__":
    arguments = parse_args()
    report(asyncio.run(main(arguments)), arguments)
