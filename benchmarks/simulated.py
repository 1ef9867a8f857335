"""RollArt's system figures on simulated compute: every mode, scheduling level and hardware mix.

Generation replicas and the trainer spend time by the roofline cost model of
`rollart.simulation` (a Qwen3-8B-sized model; H800 and H20 from their data sheets; see
`sim_cost_model` in the results) instead of burning this machine's CPU, so separate GPU clusters
can overlap as they do in RollArt. Everything else is real: the Temporal dev server, the training
and trajectory workflows, the sample buffer, the router, eviction and the weight path (the tiny
model's weights are published, pulled and loaded; the transfer's time is the simulated model's).
Environments are the real ones with RollArt's injected latency: Gaussian steps of mean 10 s and
std 1-10 s, and 5% of resets failing (retried), all simulated seconds scaled by TIME_SCALE.

Figures (system figures; none is a learning figure: the simulated policy samples uniformly):
(a) throughput (trained trajectories per wall second) and time to a fixed trained-sample count for
    lockstep (RollArt's Sync), sync (Sync+), one_off, async alpha 1 and 2;
(b) trajectory- vs batch-level rollout of the same episodes across env step std 1..10 s;
(c) FrozenLake on the compute pool (H800) and long answers on the bandwidth pool (H20) against
    everything on one type, at equal cost (H20:H800 = 1:2.85), as trajectories per second per cost
    of a rollout without env latency (generation-bound);
(d) the trainer's idle share waiting in get_batch, per mode, and with the streaming batch
    policy (alpha 1: after 0.3 s, train on the ready groups if they are a quarter of a batch).

Run: .venv/bin/python benchmarks/simulated.py [--iterations 6] [--smoke]
     [--parts modes sweep hardware]
Explore (the modes part only, printed, nothing written):
     .venv/bin/python benchmarks/simulated.py --modes async1 [--replicas 4] [--env-slots 160]
     [--set algorithm.redundancy=2 ...]
(writes results/simulated.json and simulated.md, and merges the sim_* keys into
results/async_vs_sync.json; --smoke: every part at the smallest size, nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from async_vs_sync import traj_vs_batch
from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rollart.config import RunConfig, SimulationConfig, parse_sets, with_overrides
from rollart.contracts import TrainingStatus, TrajectorySpec
from rollart.servers import free_port
from rollart.simulation.costs import CostModel, train_cost
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

TIME_SCALE = 0.15  # wall seconds per simulated second
ENV_MEAN_S, ENV_STD_S = 10.0, 5.0  # RollArt's injected env latency (simulated seconds)
RESET_FAILURES = 0.05
BATCH = 32
RATE = "steady_trajectories_per_s"  # after the first iteration, when every pipeline is full
MODES = [("lockstep", {"algorithm.mode": "lockstep"}),
         ("sync", {"algorithm.mode": "sync"}),
         ("one_off", {"algorithm.mode": "one_off"}),
         ("async1", {"algorithm.mode": "async", "algorithm.staleness": 1}),
         ("async2", {"algorithm.mode": "async", "algorithm.staleness": 2}),
         ("async1_streaming", {"algorithm.mode": "async", "algorithm.staleness": 1,
                               "algorithm.batch_policy": "streaming",
                               "algorithm.batch_deadline_s": 0.3,
                               "algorithm.streaming_min_share": 0.25})]
STDS = [1.0, 2.5, 5.0, 10.0]
SWEEP_TRAJECTORIES, SWEEP_TURNS, SWEEP_REPEATS = 32, 6, 2
# (c): equal cost. 2 H800 = 5.7, 6 H20 = 6.0, 1 H800 + 3 H20 = 5.85 (relative cost units).
HW_TIME_SCALE = 2.0  # (c) runs slower than real time: 128 trajectories at once
HW_LAYOUTS = {"mix": {"h800": 1, "h20": 3}, "compute_only": {"h800": 2},
              "bandwidth_only": {"h20": 6}}
PARTS = ["modes", "sweep", "hardware"]
HERE = Path(__file__).parent
console = Console()


def faults(std_s: float = ENV_STD_S) -> dict:
    return {"step_mean_s": ENV_MEAN_S * TIME_SCALE, "step_std_s": std_s * TIME_SCALE,
            "reset_failure_rate": RESET_FAILURES}


def base_config(server: DevServer, work: Path, replicas: dict[str, int], domains: dict,
                **overrides) -> RunConfig:
    pools = [{"name": "cpu", "role": role} for role in ("env", "reward", "train")]
    pools += [{"name": name, "role": "gen", "hardware": name, "replicas": n}
              for name, n in replicas.items()]
    data = {"temporal": {"address": server.address}, "run_dir": str(work),
            "weights": {"backend": "local"}, "pools": pools, "domains": domains,
            "simulation": {"enabled": True, "time_scale": TIME_SCALE},
            "trainer": {"checkpoint_every": 0},
            "algorithm": {"group_size": 8, "batch_size": BATCH, "minibatches": 1,
                          "rollout_unit": "trajectory"}}  # the paper's Sync+ and async
    return with_overrides(RunConfig.model_validate(data), **overrides)


def frozenlake(gen_pool: str, std_s: float = ENV_STD_S) -> dict:
    return {"frozenlake": {"gen_pool": gen_pool, "max_turns": 8, "faults": faults(std_s)}}


async def train(client, config: RunConfig, name: str) -> dict:
    started = time.perf_counter()
    status = await client.execute_workflow(
        TrainingWorkflow.run, TrainingInput(config=config), id=f"sim-{name}",
        task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    wall = time.perf_counter() - started
    history = status.history
    steady_s = (history[-1].ended_at - history[0].ended_at).total_seconds()
    return {"wall_s": wall, "iterations": status.iteration, "trained": status.ledger.trained,
            "steady_trajectories_per_s": sum(m.trajectories for m in history[1:]) / steady_s
            if len(history) > 1 else None,
            "evicted": status.ledger.evicted, "failed": status.ledger.failed,
            "trajectories_per_s": status.ledger.trained / wall,
            "trainer_idle_share": sum(m.trainer_idle_s for m in history)
            / max(sum(m.step_s for m in history), 1e-9),
            "rollout_s_mean": statistics.fmean(m.rollout_s for m in history),
            "train_s_mean": statistics.fmean(m.train_s for m in history),
            "weight_update_s_mean": statistics.fmean(m.weight_update_s for m in history),
            "lag_mean": statistics.fmean(m.lag_mean for m in history),
            "stale_token_share": statistics.fmean(m.stale_token_share for m in history)}


async def modes_part(server: DevServer, work: Path, args: argparse.Namespace,
                     progress) -> dict:
    """Every mode of MODES named in args.modes, with args.replicas H800 replicas, the env pool's
    args.env_slots and the --set overrides on top of each mode's own."""
    config = base_config(server, work / "modes", {"h800": args.replicas}, frozenlake("h800"),
                         **{"algorithm.iterations": args.iterations})
    if args.env_slots:
        config = config.model_copy(update={"pools": [
            pool.model_copy(update={"concurrency": args.env_slots}) if pool.role == "env"
            else pool for pool in config.pools]})
    sets, results = parse_sets(args.set), {}
    config = with_overrides(config, **sets)  # the fleet's workers price by the fleet's config
    chosen = [(name, overrides) for name, overrides in MODES if name in args.modes]
    task = progress.add_task("modes", total=len(chosen))
    async with in_process_fleet(config) as client:
        for name, overrides in chosen:
            progress.update(task, description=f"training ({name})")
            # --set again after the mode's own overrides, so that the user's value wins
            run_config = with_overrides(config, **overrides, **sets, run_dir=str(work / name))
            results[name] = await train(client, run_config, name)
            progress.advance(task)
    return results


async def sweep_part(server: DevServer, work: Path, trajectories: int, turns: int,
                     progress) -> dict:
    """The same fixed-length episodes (corridor) at each env step std, one workflow per
    trajectory vs all of them in lockstep; the mean of SWEEP_REPEATS rounds."""
    config = base_config(server, work / "sweep", {"h800": 2}, frozenlake("h800"))
    results = {}
    task = progress.add_task("std sweep", total=len(STDS))
    async with in_process_fleet(config, roles=("control", "env", "reward", "gen")) as client:
        for std in STDS:
            progress.update(task, description=f"scheduling (std {std} s)")
            swept = with_overrides(config, domains={"frozenlake": {
                "env": "corridor", "gen_pool": "h800", "max_turns": turns,
                "faults": faults(std)}})
            repeats = [await traj_vs_batch(client, swept, f"sweep-{std}-{k}", trajectories)
                       for k in range(SWEEP_REPEATS)]
            results[str(std)] = {key: statistics.fmean(r[key] for r in repeats)
                                 for key in repeats[0] if key != "auto_unit"}
            results[str(std)]["auto_units"] = [r["auto_unit"] for r in repeats]
            progress.advance(task)
    return results


async def hardware_part(server: DevServer, work: Path, per_domain: int, progress) -> dict:
    """Rollout of `per_domain` FrozenLake and as many long-answer trajectories at once on each
    equal-cost layout, without env latency so that generation is what takes the time, and at
    HW_TIME_SCALE so that the simulated replicas, not the orchestration, bound it."""
    sim = SimulationConfig()
    results = {}
    task = progress.add_task("hardware", total=len(HW_LAYOUTS))
    for name, replicas in HW_LAYOUTS.items():
        progress.update(task, description=f"hardware ({name})")
        multi_pool, answer_pool = ("h800", "h20") if name == "mix" else (next(iter(replicas)),) * 2
        domains = {"frozenlake": {"gen_pool": multi_pool, "max_turns": 8},
                   "arithmetic": {"gen_pool": answer_pool, "kwargs": {"digits": 4},
                                  "max_turns": 1}}
        config = base_config(server, work / f"hw-{name}", replicas, domains,
                             **{"simulation.time_scale": HW_TIME_SCALE})
        specs = [TrajectorySpec.for_domain(config, domain, f"hw-{name}-{domain}-{i}", f"g{i}",
                                           seed=i)
                 for domain in domains for i in range(per_domain)]
        cost = sum(n * sim.hardware[pool].relative_cost for pool, n in replicas.items())
        async with in_process_fleet(config, roles=("control", "env", "reward", "gen")) as client:
            started = time.perf_counter()
            await asyncio.gather(*(client.execute_workflow(
                TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                task_queue=config.temporal.control_queue) for spec in specs))
            simulated_s = (time.perf_counter() - started) / HW_TIME_SCALE
        results[name] = {"replicas": replicas, "relative_cost": cost,
                         "rollout_simulated_s": simulated_s,
                         "trajectories_per_s": len(specs) / simulated_s,
                         "trajectories_per_s_per_cost": len(specs) / simulated_s / cost}
        progress.advance(task)
    return results


def cost_model() -> dict:
    """Every parameter of the cost model and what it gives, for the record."""
    sim = SimulationConfig(time_scale=TIME_SCALE)
    figures = {}
    for label in sim.hardware:
        cost = CostModel(sim, sim.hardware[label])
        figures[label] = {"decode_step_ms_batch1": cost.step_s(1, 2000) * 1e3,
                          "prefill_ms_per_1k_tokens": cost.step_s(1000, 0) * 1e3}
    trainer = train_cost(sim)
    return {"parameters": sim.model_dump(), "derived": {
        **figures, "train_s_per_1m_tokens": trainer.train_s(1e6) - sim.train_fixed_s,
        "weight_push_or_pull_s": trainer.transfer_s(), "weight_load_s": trainer.load_s()},
        "env": {"step_mean_s": ENV_MEAN_S, "step_std_s": ENV_STD_S,
                "reset_failure_rate": RESET_FAILURES},
        "sources": {
            "H800": "NVIDIA H800 SXM: 989 dense BF16 TFLOPS, 3.35 TB/s HBM3",
            "H20": "NVIDIA H20: 148 dense BF16 TFLOPS, 4.0 TB/s HBM3",
            "relative_cost": "RollArt: H20:H800 = 1:2.85",
            "model": "Qwen3-8B: 8.2B parameters, 36 layers, 8 KV heads of 128 dims, BF16",
            "env": "RollArt: Gaussian env latency, mean 10 s, std 1-10 s",
            "efficiencies": "assumed: 50% MFU generation, 70% MBU decode, 35% MFU training",
            "links": "assumed: 200 Gb/s RDMA between clusters, PCIe 5 x16 host to GPU"}}


async def main(args: argparse.Namespace) -> dict:
    global TIME_SCALE, BATCH, HW_TIME_SCALE
    if args.smoke:  # everything 10x faster, smallest sizes
        TIME_SCALE, BATCH, HW_TIME_SCALE = TIME_SCALE / 10, 16, HW_TIME_SCALE / 10
        STDS[:] = STDS[-1:]
    work = Path(tempfile.mkdtemp(prefix="rollart-sim-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    if args.smoke:
        args.iterations = 2
    sweep = (8, 2) if args.smoke else (SWEEP_TRAJECTORIES, SWEEP_TURNS)
    results: dict = {}
    try:
        with Progress(console=console) as progress:
            if "modes" in args.parts:
                results["modes"] = await modes_part(server, work, args, progress)
            if "sweep" in args.parts:
                results["sweep"] = await sweep_part(server, work, *sweep, progress)
            if "hardware" in args.parts:
                results["hardware"] = await hardware_part(server, work, 4 if args.smoke else 64,
                                                          progress)
    finally:
        server.stop()
    return results


def summarize(results: dict) -> dict:
    modes, sweep, hw = results["modes"], results["sweep"], results["hardware"]

    def ratio(name: str) -> float:
        key = RATE
        return modes["async1"][key] / modes[name][key]

    return {
        "sim_throughput_ratio_async1_vs_lockstep": ratio("lockstep"),
        "sim_throughput_ratio_async1_vs_sync": ratio("sync"),
        "sim_throughput_ratio_async1_vs_one_off": ratio("one_off"),
        "sim_traj_vs_batch_ratio": {std: r["ratio"] for std, r in sweep.items()},
        "sim_hw_mix_vs_compute_only": hw["mix"]["trajectories_per_s_per_cost"]
        / hw["compute_only"]["trajectories_per_s_per_cost"],
        "sim_hw_mix_vs_bandwidth_only": hw["mix"]["trajectories_per_s_per_cost"]
        / hw["bandwidth_only"]["trajectories_per_s_per_cost"],
        "sim_trainer_idle_share": {name: r["trainer_idle_share"] for name, r in modes.items()},
        "sim_cost_model": cost_model(),
        "sim_time_scale": TIME_SCALE,
        "sim_runs": results,
    }


def print_modes(modes: dict) -> None:
    table = Table(title="simulated compute: modes (system figures; exploring, nothing written)")
    columns = {RATE: "traj/s (steady)", "trainer_idle_share": "idle share",
               "rollout_s_mean": "rollout s", "train_s_mean": "train s",
               "evicted": "evicted", "failed": "failed"}
    for header in ["mode", *columns.values()]:
        table.add_column(header, justify="right")
    for name, r in modes.items():
        table.add_row(name, *(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k])
                              for k in columns))
    console.print(table)


def report(summary: dict, args: argparse.Namespace) -> None:
    modes = summary["sim_runs"]["modes"]
    columns = ["mode", "traj/s (steady)", "async1 x", f"wall s to {modes['sync']['trained']} "
               "trained", "rollout s", "train s", "update s", "idle share", "evicted", "failed"]
    table = Table(title="simulated compute: modes (system figures)")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    async1 = modes["async1"][RATE]
    for name, r in modes.items():
        row = [name, f"{r[RATE]:.2f}", f"{async1 / r[RATE]:.2f}",
               f"{r['wall_s']:.0f}", f"{r['rollout_s_mean']:.1f}", f"{r['train_s_mean']:.1f}",
               f"{r['weight_update_s_mean']:.1f}", f"{r['trainer_idle_share']:.2f}",
               str(r["evicted"]), str(r["failed"])]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    sweep_lines = ["| env step std (s, simulated) | trajectory-level s | batch-level s | "
                   "batch / trajectory |", "|---|---|---|---|"]
    for std, r in summary["sim_runs"]["sweep"].items():
        sweep_lines.append(f"| {std} | {r['trajectory_level_s']:.1f} | {r['batch_level_s']:.1f} "
                           f"| {r['ratio']:.2f} |")
    hw_lines = ["| layout | replicas | cost | rollout s (simulated) | traj/s | traj/s per cost |",
                "|---|---|---|---|---|---|"]
    for name, r in summary["sim_runs"]["hardware"].items():
        hw_lines.append(f"| {name} | {r['replicas']} | {r['relative_cost']:.2f} | "
                        f"{r['rollout_simulated_s']:.1f} | {r['trajectories_per_s']:.2f} | "
                        f"{r['trajectories_per_s_per_cost']:.3f} |")
    console.print("\n".join(sweep_lines + [""] + hw_lines))
    if args.smoke:
        return
    save("simulated", summary, "Simulated compute: RollArt's system figures",
         f".venv/bin/python benchmarks/simulated.py --iterations {args.iterations}",
         [f"System figures (simulated compute; time scale {TIME_SCALE} wall s per simulated "
          "s; the cost model and its sources are `sim_cost_model` in "
          "`results/simulated.json`). FrozenLake, env steps Gaussian mean "
          f"{ENV_MEAN_S:.0f} s std {ENV_STD_S:.0f} s (simulated), {RESET_FAILURES:.0%} of "
          f"resets failing; batch 32 (groups of 8), {args.iterations} iterations per mode, "
          "2 H800 replicas.", "", *lines, "", "## Trajectory- vs batch-level scheduling", "",
          *sweep_lines, "", "## Hardware affinity at equal cost", "",
          "64 FrozenLake episodes (multi-turn, prefill-heavy: 32 simulated tokens per prompt "
          "token, one action per turn) and 64 sums of 4-digit numbers (one answer, "
          "decode-heavy: 512 simulated tokens per answer digit, about 2,500 per answer) rolled "
          "out at once, no env latency; mix: FrozenLake on H800, answers on H20. Time in "
          "simulated seconds.", "",
          *hw_lines])
    recorded_path = HERE / "results" / "async_vs_sync.json"
    recorded = json.loads(recorded_path.read_text())
    recorded.update({k: v for k, v in summary.items() if k != "sim_runs"})
    recorded_path.write_text(json.dumps(recorded, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--parts", nargs="+", default=PARTS, choices=PARTS,
                        help="rerun only these parts; the others keep their recorded results")
    parser.add_argument("--smoke", action="store_true")
    explore = parser.add_argument_group(
        "exploring (modes part only; prints its table and writes nothing)")
    explore.add_argument("--modes", nargs="+", choices=[name for name, _ in MODES],
                         default=[name for name, _ in MODES])
    explore.add_argument("--replicas", type=int, default=2, help="H800 replicas")
    explore.add_argument("--env-slots", type=int, default=None,
                         help="env steps the env pool runs at once (its default: 64)")
    explore.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="a config override for every mode, e.g. algorithm.redundancy=2")
    args = parser.parse_args()
    exploring = (len(args.modes) < len(MODES) or args.replicas != 2 or args.env_slots
                 or args.set)
    if exploring:
        args.parts = ["modes"]
        print_modes(asyncio.run(main(args))["modes"])
        raise SystemExit(0)
    measured = asyncio.run(main(args))
    recorded = HERE / "results" / "simulated.json"
    if set(args.parts) != set(PARTS) and not args.smoke:
        measured = {**json.loads(recorded.read_text())["sim_runs"], **measured}
    report(summarize(measured), args)
