"""Sync vs one-off vs async (alpha 1, 2) training under long-tail environment latency, every
mode with batched turns, beside sync and alpha 1 with one workflow per trajectory.

Side by side in one process, on one dev server (SQLite) and one vLLM engine: FrozenLake with
injected latency (lognormal env steps, a share of very slow resets), each mode trained `--seeds`
times (independent repeats: the engine's sampling stream and the workflow's random draws differ
between them; the fleet's trainer and model seed stay 0) until the batch success rate
reaches the target or the iteration cap. Throughput is trained trajectories (and their sampled
tokens) per second of run wall time; time-to-score is the wall time until the first batch at the
target, averaged over the runs that reached it. Ratios are to sync. Every run's curve and
per-iteration learning figures (step KL, entropy, importance ratios, fresh and stale groups) are
kept in the JSON; `results/async_vs_sync.png` plots all curves.

`--batch-policy-only` trains async alpha 1 with the blocking and the streaming get_batch,
`--seeds` runs each, and merges that comparison into the recorded JSON.

`--multitask` (or `--multitask-only`, merged into the recorded JSON) also trains
examples/multitask.toml and each of its domains alone, `--seeds` runs each
(`results/multitask.png` plots them); `--multitask-runs both` reruns only the runs together and
keeps the recorded single-domain runs.

Weights go through local files, as when the results were first measured (before the Mooncake
store), so a rerun compares with them and needs no mooncake_master.

Run: .venv/bin/python benchmarks/async_vs_sync.py [--target 0.8] [--max-iterations 30]
     [--batch 64] [--seeds 3] [--multitask | --multitask-only | --scheduling-only
     | --batch-policy-only] [--smoke]
(writes results/async_vs_sync.json and async_vs_sync.md beside this file; --smoke: every mode,
the scheduling comparison and the multitask runs at the smallest sizes, nothing written;
--out FILE writes the summary there instead, for experiments)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import tomllib
from pathlib import Path

from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rollart.config import RunConfig, load_config
from rollart.contracts import TrainingStatus, TrajectorySpec
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.servers import free_port
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.scheduling import batch_rollout, lockstep_wait_s
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

# Every mode's groups take their turns together (the groups started together, in one workflow):
# with one workflow per trajectory, alpha 1's 128 trajectories in flight keep the 2-core dev
# server's CPU busy, so its rollout computes instead of waiting on env latency, and training
# beside it gains nothing. The *_trajectory modes give each trajectory its own workflow, at its
# own env's pace: sync_trajectory is RollArt's Sync+ (async env steps within a sync step), the
# fairer sync baseline here; async1_trajectory is alpha 1 as measured before batched turns.
ROLLOUT_UNIT = "batch"
MODES = [("sync", {"algorithm.mode": "sync"}),
         ("one_off", {"algorithm.mode": "one_off"}),
         ("async1", {"algorithm.mode": "async", "algorithm.staleness": 1}),
         ("async2", {"algorithm.mode": "async", "algorithm.staleness": 2}),
         ("sync_trajectory", {"algorithm.mode": "sync", "algorithm.rollout_unit": "trajectory"}),
         ("async1_trajectory", {"algorithm.mode": "async", "algorithm.staleness": 1,
                                "algorithm.rollout_unit": "trajectory"})]
# get_batch's policy at alpha 1 (issue: a trainer that does not idle), side by side.
BATCH_POLICIES = [("blocking", {}), ("streaming", {"algorithm.batch_policy": "streaming"})]
LATENCY = {"step_median_s": 0.05, "step_sigma": 1.0, "slow_reset_share": 0.1,
           "slow_reset_s": 3.0}
console = Console()


async def run_mode(client, base: dict, name: str, overrides: dict, seed: int) -> dict:
    config = load_config(None, **{**base, **overrides,
                                  "run_dir": str(Path(base["run_dir"]) / f"{name}-s{seed}")})
    started = time.perf_counter()
    handle = await client.start_workflow(
        TrainingWorkflow.run, TrainingInput(config=config), id=f"bench-{name}-s{seed}",
        task_queue=config.temporal.control_queue, result_type=TrainingStatus)
    launched = (await handle.describe()).start_time
    status = await handle.result()
    wall = time.perf_counter() - started
    target = config.algorithm.stop_at_success
    hit = next((m for m in status.history if m.success_rate >= target), None)
    history = status.history
    return {
        "seed": seed,
        "wall_s": wall,
        "iterations": status.iteration,
        "trained": status.ledger.trained,
        "evicted": status.ledger.evicted,
        "failed": status.ledger.failed,
        "trajectories_per_s": status.ledger.trained / wall,
        "tokens_per_s": sum(m.generated_tokens for m in history) / wall,
        "time_to_score_s": (hit.ended_at - launched).total_seconds() if hit else None,
        "final_success": history[-1].success_rate,
        "trainer_idle_share": sum(m.trainer_idle_s for m in history)
        / max(sum(m.step_s for m in history), 1e-9),
        "lag_mean": sum(m.lag_mean for m in history) / len(history),
        "stale_token_share": sum(m.stale_token_share for m in history) / len(history),
        "curve": [{"iteration": m.iteration, "elapsed_s": (m.ended_at - launched).total_seconds(),
                   "success": m.success_rate,
                   "domains": {d: v.success_rate for d, v in m.domains.items()},
                   "stale_token_share": m.stale_token_share,
                   **(m.learning.model_dump() if m.learning else {})} for m in history],
    }


SCHEDULING_SIGMAS = {"low_variance": 0.25, "high_variance": 1.5}
SCHEDULING_TRAJECTORIES, SCHEDULING_TURNS = 32, 8
SCHEDULING_REPEATS = 3  # unseeded heavy-tailed latency: one round is one draw of the tail
SMOKE = {"algorithm.group_size": 4, "algorithm.batch_size": 16, "algorithm.minibatches": 1,
         "algorithm.iterations": 2}
SMOKE_TRAJECTORIES, SMOKE_TURNS = 4, 2


async def scheduling(client, base: dict, trajectories: int, turns: int,
                     repeats: int = SCHEDULING_REPEATS) -> dict:
    """Trajectory-level (one workflow per trajectory, each at its own pace) vs batch-level
    (lockstep turns) rollout of the same fixed-length episodes, as env latency variance grows;
    seconds are means over `repeats` rounds, the ratio is of the means."""
    results = {}
    for label, sigma in SCHEDULING_SIGMAS.items():
        latency = {"step_median_s": 0.05, "step_sigma": sigma}
        config = load_config(None, **{**base, "domains.frozenlake.faults": latency,
                                      "domains.frozenlake.env": "corridor",
                                      "domains.frozenlake.max_turns": turns})
        rounds = [await traj_vs_batch(client, config, f"sched-{label}-{k}", trajectories)
                  for k in range(repeats)]
        traj_s = statistics.fmean(r["trajectory_level_s"] for r in rounds)
        batch_s = statistics.fmean(r["batch_level_s"] for r in rounds)
        auto_s = statistics.fmean(r["auto_s"] for r in rounds)
        results[label] = {"step_sigma": sigma, "trajectory_level_s": traj_s,
                          "batch_level_s": batch_s, "ratio": batch_s / traj_s,
                          "auto_s": auto_s, "auto_ratio": batch_s / auto_s,
                          "auto_units": [r["auto_unit"] for r in rounds], "rounds": rounds}
    return results


async def traj_vs_batch(client, config: RunConfig, label: str, trajectories: int) -> dict:
    """The same episodes of config's frozenlake domain, one workflow per trajectory, then all
    in one BatchRolloutWorkflow; wall seconds of each. rollout_unit auto's choice follows from
    the env steps the trajectory-level run measured (the rule the TrainingWorkflow applies to
    the steps of earlier iterations); its time is the chosen run's."""
    specs = [TrajectorySpec.for_domain(config, "frozenlake", f"{label}-{kind}-{i}", f"g{i}",
                                       seed=i)
             for kind in ("traj", "batch") for i in range(trajectories)]
    queue = config.temporal.control_queue
    started = time.perf_counter()
    results = await asyncio.gather(*(
        client.execute_workflow(TrajectoryWorkflow.run, spec, id=spec.trajectory_id,
                                task_queue=queue)
        for spec in specs[:trajectories]))
    trajectory_s = time.perf_counter() - started
    steps = [s for r in results for s in r.env_step_times]
    algo = config.algorithm
    batched = batch_rollout("auto", {"frozenlake": steps}, ["frozenlake"], trajectories,
                            algo.batch_turn_overhead_s)
    started = time.perf_counter()
    await client.execute_workflow(BatchRolloutWorkflow.run, specs[trajectories:],
                                  id=f"{label}-batch", task_queue=queue)
    batch_s = time.perf_counter() - started
    return {"trajectory_level_s": trajectory_s, "batch_level_s": batch_s,
            "ratio": batch_s / trajectory_s, "auto_unit": "batch" if batched else "trajectory",
            "auto_s": batch_s if batched else trajectory_s,
            "lockstep_wait_s": lockstep_wait_s(steps, trajectories)}


MULTITASK = Path(__file__).parent.parent / "examples" / "multitask.toml"


def multitask_config(base: dict, name: str, domains: list[str]) -> RunConfig:
    """examples/multitask.toml as written, trained on `domains` only (the rest dropped)."""
    data = tomllib.loads(MULTITASK.read_text())
    data["domains"] = {k: v for k, v in data["domains"].items() if k in domains}
    data.update(run_dir=str(Path(base["run_dir"]) / name))
    data.setdefault("temporal", {})["address"] = base["temporal.address"]
    data.setdefault("weights", {})["backend"] = "local"
    if "algorithm.iterations" in base:
        data["algorithm"]["iterations"] = base["algorithm.iterations"]
    return RunConfig.model_validate(data)


MULTITASK_RUNS = {"both": ["frozenlake", "arithmetic"], "frozenlake": ["frozenlake"],
                  "arithmetic": ["arithmetic"]}


async def multitask(engine, base: dict, smoke: bool, seeds: range, only: list[str]) -> dict:
    """Both domains with one policy, and each alone, with the example's settings, `seeds` runs
    of each (of the `only` ones): success per domain at the start and over the last 3
    iterations, and each iteration's trained episodes of it, per run."""
    smoke_base = {**base, **({"algorithm.iterations": 2} if smoke else {})}
    runs = {name: domains for name, domains in MULTITASK_RUNS.items() if name in only}
    results: dict = {name: [] for name in runs}
    fleet_config = multitask_config(smoke_base, "fleet", MULTITASK_RUNS["both"])
    async with in_process_fleet(fleet_config, engine) as client:
        with Progress(console=console) as progress:
            task = progress.add_task("multitask", total=len(runs) * len(seeds))
            for seed in seeds:
                for name, domains in runs.items():
                    progress.update(task, description=f"multitask ({name}, seed {seed})")
                    config = multitask_config(smoke_base, f"multitask-{name}-s{seed}", domains)
                    if smoke:
                        config.algorithm = config.algorithm.model_copy(update={
                            "group_size": 4, "batch_size": 16, "minibatches": 1})
                    started = time.perf_counter()
                    handle = await client.start_workflow(
                        TrainingWorkflow.run, TrainingInput(config=config),
                        id=f"bench-multitask-{name}-s{seed}",
                        task_queue=config.temporal.control_queue, result_type=TrainingStatus)
                    status = await handle.result()
                    run = {"seed": seed, "wall_s": time.perf_counter() - started,
                           "domains": {domain: _domain_curve(status, domain)
                                       for domain in domains},
                           "step_kl_by_domain": [m.learning.step_kl_by_domain if m.learning
                                                 else {} for m in status.history],
                           "step_kept": [m.learning.step_kept if m.learning else None
                                         for m in status.history]}
                    results[name].append(run)
                    console.print(f"multitask {name} seed {seed}: {run['wall_s']:.0f} s, "
                                  f"{json.dumps(run['domains'])}")
                    progress.advance(task)
    return results


def _domain_curve(status: TrainingStatus, domain: str) -> dict:
    history = [m for m in status.history if domain in m.domains]
    return {"initial": history[0].domains[domain].success_rate,
            "final": statistics.fmean(m.domains[domain].success_rate for m in history[-3:]),
            "curve": [m.domains[domain].success_rate if domain in m.domains else None
                      for m in status.history],
            "episodes": [m.domains[domain].trajectories if domain in m.domains else 0
                         for m in status.history]}


def success_at_episodes(run: dict, domain: str, episodes: float, batch_size: int) -> float:
    """A run's success on `domain` (mean of 3 iterations) where it had trained `episodes` of
    it: one domain learning on half the data is compared with itself on as much data. Runs
    recorded before episodes were counted trained `batch_size` of their one domain a step."""
    curve = run["domains"][domain]
    counts = curve.get("episodes") or [batch_size] * len(curve["curve"])
    trained, end = 0, len(counts)
    for k, count in enumerate(counts):
        trained += count
        if trained >= episodes:
            end = k + 1
            break
    return statistics.fmean(s for s in curve["curve"][max(0, end - 3):end] if s is not None)


async def main(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="rollart-async-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    engine = await PolicyEngine(resolve_model_path(None), load_config(None).engine).start()
    base = {"temporal.address": server.address, "run_dir": str(work),
            "algorithm.group_size": 8, "algorithm.batch_size": args.batch,
            "algorithm.iterations": args.max_iterations, "algorithm.rollout_unit": ROLLOUT_UNIT,
            "algorithm.stop_at_success": args.target, "domains.frozenlake.faults": LATENCY,
            "weights.backend": "local", **(SMOKE if args.smoke else {}),
            **dict(item.split("=", 1) for item in args.set)}
    sizes = ((SMOKE_TRAJECTORIES, SMOKE_TURNS) if args.smoke
             else (SCHEDULING_TRAJECTORIES, SCHEDULING_TURNS))
    seeds = range(1 if args.smoke else args.seeds)
    modes = ([] if args.multitask_only or args.scheduling_only
             else [(n, o) for n, o in MODES if n in args.modes])
    policies = [(f"async1_{name}", {**dict(MODES)["async1"], **o}) for name, o in BATCH_POLICIES]
    if args.batch_policy_only:
        modes = policies
    elif args.smoke and "async1" in dict(modes):
        modes += policies[1:]
    results: dict = {"modes": {}, "multitask": {}}
    try:
        async with in_process_fleet(load_config(None, **base), engine) as client:
            if not (args.no_scheduling or args.multitask_only or args.batch_policy_only):
                results["scheduling"] = await scheduling(
                    client, base, *sizes, repeats=1 if args.smoke else SCHEDULING_REPEATS)
            with Progress(console=console) as progress:
                task = progress.add_task("runs", total=len(modes) * len(seeds))
                for seed in seeds:
                    for name, overrides in modes:
                        progress.update(task, description=f"training ({name}, seed {seed})")
                        run = await run_mode(client, base, name, overrides, seed)
                        results["modes"].setdefault(name, []).append(run)
                        progress.advance(task)
        if (args.multitask or args.multitask_only or args.smoke) and not args.scheduling_only:
            results["multitask"] = await multitask(engine, base, args.smoke, seeds,
                                                   args.multitask_runs)
    finally:
        engine.shutdown()
        server.stop()
    return results


SCHEDULING_HEADING = "## Trajectory- vs batch-level scheduling"
BATCH_POLICY_HEADING = "## get_batch at alpha 1: blocking vs streaming"


def batch_policy_summary(modes: dict) -> dict:
    """Per policy: runs at the target, time to score, final success, the trainer's idle share
    and what was evicted; and the time-to-score ratio of streaming over blocking."""
    policies = {}
    for name, runs in modes.items():
        policies[name.removeprefix("async1_")] = {
            "seeds_reaching_target": sum(r["time_to_score_s"] is not None for r in runs),
            "runs": len(runs),
            "time_to_score_s": spread([r["time_to_score_s"] for r in runs]),
            "final_success": [r["final_success"] for r in runs],
            "trainer_idle_share": spread([r["trainer_idle_share"] for r in runs]),
            "trajectories_per_s": spread([r["trajectories_per_s"] for r in runs]),
            "evicted": sum(r["evicted"] for r in runs)}
    blocking, streaming = (policies.get(n, {}).get("time_to_score_s")
                           for n in ("blocking", "streaming"))
    return {"policies": policies, "tts_ratio_streaming_vs_blocking":
            blocking["mean"] / streaming["mean"] if blocking and streaming else None}


def batch_policy_lines(summary: dict) -> list[str]:
    runs = max(p["runs"] for p in summary["policies"].values())
    lines = [BATCH_POLICY_HEADING, "",
             "async alpha 1 as in the table above, with `algorithm.batch_policy` blocking (the "
             "default: the trainer waits for a full batch) and streaming (after "
             "`batch_deadline_s` it trains on the complete admissible groups it has, at least "
             f"`streaming_min_share` of a batch); {runs} runs each, side by side in one run of "
             f"`--batch-policy-only --seeds {runs}` ({summary.get('date', '')}, rollout unit "
             f"{summary.get('rollout_unit', 'trajectory')}; learning "
             "figures; idle share is a system figure of the same runs).", "",
             "| get_batch | runs at target | time to score s (mean, min-max) | final success "
             "| idle share (mean, min-max) | traj/s | evicted |", "|---|---|---|---|---|---|---|"]

    lines += [f"| {name} | {p['seeds_reaching_target']} of {p['runs']} "
              f"| {spread_text(p['time_to_score_s'], '.0f')} "
              f"| {' '.join(f'{v:.2f}' for v in p['final_success'])} "
              f"| {spread_text(p['trainer_idle_share'])} | {p['trajectories_per_s']['mean']:.2f} "
              f"| {p['evicted']} |" for name, p in summary["policies"].items()]
    ratio = summary["tts_ratio_streaming_vs_blocking"]
    if ratio is not None:
        lines += ["", f"Streaming reaches the target {ratio:.2f}x as fast as blocking (mean time "
                  "to score, blocking's over streaming's)."]
    return lines


def scheduling_lines(sched: dict) -> list[str]:
    lines = [SCHEDULING_HEADING, "",
             f"{SCHEDULING_TRAJECTORIES} corridor episodes of {SCHEDULING_TURNS} turns, "
             "lognormal env steps (median 50 ms); batch-level = all trajectories take each turn "
             "together; auto = `algorithm.rollout_unit = \"auto\"`, which batches when the "
             "measured env steps make lockstep wait no longer a turn than the orchestration it "
             "saves (`batch_turn_overhead_s`).", "",
             "| env step sigma | trajectory-level s | batch-level s | batch / trajectory "
             "| auto chose | batch / auto |",
             "|---|---|---|---|---|---|"]
    rounds = len(next(iter(sched.values())).get("rounds", [None]))
    lines[2] += f" Seconds: mean of {rounds} rounds."
    lines += [f"| {r['step_sigma']} | {r['trajectory_level_s']:.1f} | {r['batch_level_s']:.1f} "
              f"| {r['ratio']:.2f} | {', '.join(r['auto_units'])} | {r['auto_ratio']:.2f} |"
              for r in sched.values()]
    return lines


def spread_text(s: dict | None, spec: str = ".2f") -> str:
    """A spread as "mean (min-max)"; "-" for none."""
    if s is None:
        return "-"
    return f"{s['mean']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def spread(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "n": len(values)}


def plot(modes: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_iteration) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = dict(zip(modes, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for name, runs in modes.items():
        for k, run in enumerate(runs):
            label = name if k == 0 else None
            curve = run["curve"]
            by_time.plot([c["elapsed_s"] / 60 for c in curve], [c["success"] for c in curve],
                         color=colors[name], alpha=0.8, label=label)
            by_iteration.plot([c["iteration"] for c in curve], [c["success"] for c in curve],
                              color=colors[name], alpha=0.8, label=label)
    by_time.set_xlabel("wall time since launch (min)")
    by_iteration.set_xlabel("iteration")
    by_time.set_ylabel("batch success rate")
    for ax in (by_time, by_iteration):
        ax.grid(alpha=0.3)
        ax.set_ylim(-0.02, 1.02)
    by_iteration.legend()
    fig.suptitle("FrozenLake with long-tail env latency: every run of every mode")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def summarize(results: dict, args: argparse.Namespace) -> dict:
    modes = results["modes"]

    def mean_of(name: str, key: str) -> float | None:
        found = spread([r[key] for r in modes.get(name, [])])
        return found["mean"] if found else None

    def ratio(name: str, key: str, invert: bool = False, base: str = "sync") -> float | None:
        a, b = mean_of(name, key), mean_of(base, key)
        if a is None or b is None or not (a and b):
            return None
        return b / a if invert else a / b

    summary = {
        "seeds_reaching_target": {n: sum(r["time_to_score_s"] is not None for r in runs)
                                  for n, runs in modes.items()},
        "final_success": {n: [r["final_success"] for r in runs] for n, runs in modes.items()},
        "time_to_score_s": {n: spread([r["time_to_score_s"] for r in runs])
                            for n, runs in modes.items()},
        "throughput_ratio_async1_vs_sync": ratio("async1", "trajectories_per_s"),
        "tts_ratio_async1_vs_sync": ratio("async1", "time_to_score_s", invert=True),
        "throughput_ratio_async2_vs_sync": ratio("async2", "trajectories_per_s"),
        "throughput_ratio_one_off_vs_sync": ratio("one_off", "trajectories_per_s"),
        "tts_ratio_one_off_vs_sync": ratio("one_off", "time_to_score_s", invert=True),
        "tts_ratio_async2_vs_sync": ratio("async2", "time_to_score_s", invert=True),
        "tts_ratio_async1_vs_sync_trajectory": ratio("async1", "time_to_score_s", invert=True,
                                                     base="sync_trajectory"),
        "tts_ratio_sync_vs_sync_trajectory": ratio("sync", "time_to_score_s", invert=True,
                                                   base="sync_trajectory"),
        "tts_ratio_async1_vs_async1_trajectory": ratio("async1", "time_to_score_s",
                                                       invert=True, base="async1_trajectory"),
        "setup": {"batch_size": args.batch, "group_size": 8, "target": args.target,
                  "rollout_unit": ROLLOUT_UNIT,
                  "max_iterations": args.max_iterations, "latency": LATENCY,
                  "seeds": args.seeds, "overrides": dict(item.split("=", 1) for item in args.set)},
        "modes": modes,
    }
    if results.get("multitask"):
        summary["multitask_final_success"] = multitask_summary(results["multitask"])
        summary["multitask"] = results["multitask"]
    if "scheduling" in results:
        sched = results["scheduling"]
        summary["traj_vs_batch_ratio_high_variance"] = sched["high_variance"]["ratio"]
        summary["traj_vs_batch_ratio_low_variance"] = sched["low_variance"]["ratio"]
        summary["auto_vs_batch_ratio_high_variance"] = sched["high_variance"]["auto_ratio"]
        summary["auto_vs_batch_ratio_low_variance"] = sched["low_variance"]["auto_ratio"]
        summary["scheduling"] = sched
    return summary


MULTITASK_HEADING = "## Two domains, one policy"


def multitask_summary(multi: dict) -> dict:
    """Per domain: where it started (mean over the runs together), where it ended together and
    alone, and alone once it had trained as many of its episodes as it did together (mean and
    range over the runs)."""
    batch_size = tomllib.loads(MULTITASK.read_text())["algorithm"]["batch_size"]
    summary = {}
    for domain in multi["both"][0]["domains"]:
        episodes = statistics.fmean(sum(run["domains"][domain].get("episodes") or [0])
                                    for run in multi["both"])
        summary[domain] = {
            "initial": statistics.fmean(run["domains"][domain]["initial"]
                                        for run in multi["both"]),
            "together": spread([run["domains"][domain]["final"] for run in multi["both"]]),
            "alone": spread([run["domains"][domain]["final"] for run in multi[domain]]),
            "episodes_together": episodes,
            "alone_at_those_episodes": spread([
                success_at_episodes(run, domain, episodes, batch_size)
                for run in multi[domain]]) if episodes else None}
    return summary


def multitask_lines(multi: dict) -> list[str]:
    example = tomllib.loads(MULTITASK.read_text())["algorithm"]
    runs = len(multi["both"])
    iterations = len(next(iter(multi["both"][0]["domains"].values()))["curve"])
    lines = [MULTITASK_HEADING, "",
             f"`examples/multitask.toml` as written (batch {example['batch_size']}, "
             f"{iterations} iterations, loss aggregation "
             f"{example.get('loss_aggregation', 'token_mean')}, domain sampling "
             f"{example.get('domain_sampling', 'weight')}, no injected latency), both "
             f"domains with one policy and each domain alone, {runs} runs each; success is the "
             "mean over the last 3 iterations, as mean (min-max) over the runs (learning "
             "figures). Curves: `results/multitask.png`. The last column is each domain alone "
             "at the iteration where it had trained as many of its episodes as it did "
             "together over the whole run.", "",
             "| domain | start (together) | end, together | end, alone | episodes together "
             "| alone at those episodes |", "|---|---|---|---|---|---|"]

    lines += [f"| {d} | {r['initial']:.2f} | {spread_text(r['together'])} "
              f"| {spread_text(r['alone'])} | {r['episodes_together']:.0f} "
              f"| {spread_text(r['alone_at_those_episodes'])} |"
              for d, r in multitask_summary(multi).items()]
    return lines


def plot_multitask(multi: dict, out: Path) -> None:
    """One panel per domain: every run together against every run alone, by iteration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    domains = list(multi["both"][0]["domains"])
    fig, axes = plt.subplots(1, len(domains), figsize=(6 * len(domains), 4.5), sharey=True)
    for ax, domain in zip(axes, domains, strict=True):
        for name, color in (("both", "tab:blue"), (domain, "tab:gray")):
            for k, run in enumerate(multi[name]):
                curve = run["domains"][domain]["curve"]
                ax.plot(range(len(curve)), curve, color=color, alpha=0.7,
                        label=(("together" if name == "both" else "alone") if k == 0 else None))
        ax.set_title(domain)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
        ax.set_ylim(-0.02, 1.02)
        ax.legend()
    axes[0].set_ylabel("batch success rate")
    fig.suptitle("examples/multitask.toml: one policy on both domains vs each domain alone")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def report_multitask_only(results: dict) -> None:
    """Merged into the recorded JSON: the runs not rerun (--multitask-runs) stay as recorded."""
    here = Path(__file__).parent
    out = here / "results" / "async_vs_sync.json"
    recorded = json.loads(out.read_text())
    multi = {**recorded.get("multitask", {}), **results["multitask"]}
    summary = multitask_summary(multi)
    console.print(summary)
    recorded["multitask_final_success"] = summary
    recorded["multitask"] = multi
    out.write_text(json.dumps(recorded, indent=2) + "\n")
    plot_multitask(multi, here / "results" / "multitask.png")
    markdown = here / "async_vs_sync.md"
    kept = markdown.read_text().split(MULTITASK_HEADING)[0].rstrip()
    markdown.write_text(kept + "\n\n" + "\n".join(multitask_lines(multi)) + "\n")


def kept_from_other_runs(path: Path, summary: dict) -> dict:
    """Recorded keys this run does not measure: benchmarks/simulated.py's sim_* figures, and
    the multitask comparison when it was not rerun."""
    if not path.exists():
        return {}
    recorded = json.loads(path.read_text())
    return {key: value for key, value in recorded.items() if key not in summary
            and (key.startswith("sim_") or key.startswith("multitask")
                 or key == "batch_policy")}


def report_batch_policy_only(results: dict) -> None:
    """Merged into the recorded JSON (key batch_policy) and into its markdown, before the
    scheduling comparison."""
    summary = {**batch_policy_summary(results["modes"]),
               "date": time.strftime("%Y-%m-%d"), "rollout_unit": ROLLOUT_UNIT}
    lines = batch_policy_lines(summary)
    console.print("\n".join(lines))
    here = Path(__file__).parent
    out = here / "results" / "async_vs_sync.json"
    recorded = json.loads(out.read_text())
    recorded["batch_policy"] = {**summary, "modes": results["modes"]}
    out.write_text(json.dumps(recorded, indent=2) + "\n")
    markdown = here / "async_vs_sync.md"
    text = markdown.read_text()
    if BATCH_POLICY_HEADING in text:
        before, after = text.split(BATCH_POLICY_HEADING)
        rest = after[after.index("\n## "):].lstrip("\n") if "\n## " in after else ""
    else:
        before, rest = text.split(SCHEDULING_HEADING)
        rest = SCHEDULING_HEADING + rest
    markdown.write_text(before.rstrip() + "\n\n" + "\n".join(lines) + "\n\n" + rest)


def report_scheduling_only(results: dict) -> None:
    sched = results["scheduling"]
    console.print("\n".join(scheduling_lines(sched)))
    here = Path(__file__).parent
    out = here / "results" / "async_vs_sync.json"
    recorded = json.loads(out.read_text())
    recorded.update(scheduling=sched,
                    traj_vs_batch_ratio_high_variance=sched["high_variance"]["ratio"],
                    traj_vs_batch_ratio_low_variance=sched["low_variance"]["ratio"],
                    auto_vs_batch_ratio_high_variance=sched["high_variance"]["auto_ratio"],
                    auto_vs_batch_ratio_low_variance=sched["low_variance"]["auto_ratio"])
    out.write_text(json.dumps(recorded, indent=2) + "\n")
    markdown = here / "async_vs_sync.md"
    before, after = markdown.read_text().split(SCHEDULING_HEADING)
    rest = after[after.index(MULTITASK_HEADING):] if MULTITASK_HEADING in after else ""
    markdown.write_text(before + "\n".join(scheduling_lines(sched)) + "\n\n" + rest)


def report(results: dict, args: argparse.Namespace) -> None:
    if args.scheduling_only:
        if not args.smoke:
            report_scheduling_only(results)
        return
    if args.multitask_only:
        if not args.smoke:
            report_multitask_only(results)
        return
    if args.batch_policy_only:
        if not args.smoke:
            report_batch_policy_only(results)
        return
    summary = summarize(results, args)
    modes = summary["modes"]
    columns = ["mode", "runs at target", "time to score s (mean, min-max)", "x sync",
               "final success", "traj/s", "x sync", "stale tok", "evicted", "idle share"]
    table = Table(title="async vs sync, FrozenLake with long-tail env latency (learning)")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]

    def fmt(value, spec=".2f"):
        return "-" if value is None else format(value, spec)

    sync_tts = summary["time_to_score_s"].get("sync")
    sync_rate = spread([r["trajectories_per_s"] for r in modes.get("sync", [])])
    for name, runs in modes.items():
        tts = summary["time_to_score_s"][name]
        rate = spread([r["trajectories_per_s"] for r in runs])
        row = [name, f"{summary['seeds_reaching_target'][name]} of {len(runs)}",
               spread_text(tts, ".0f"),
               fmt(sync_tts["mean"] / tts["mean"] if tts and sync_tts else None),
               " ".join(f"{r['final_success']:.2f}" for r in runs), fmt(rate["mean"]),
               fmt(rate["mean"] / sync_rate["mean"] if sync_rate else None),
               fmt(statistics.fmean(r["stale_token_share"] for r in runs)),
               str(sum(r["evicted"] for r in runs)),
               fmt(statistics.fmean(r["trainer_idle_share"] for r in runs))]
        table.add_row(*row)
        lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    if args.smoke and "async1_streaming" in modes:
        pair = {"async1_blocking": modes["async1"], "async1_streaming": modes["async1_streaming"]}
        console.print("\n".join(batch_policy_lines(batch_policy_summary(pair))))
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    if args.smoke or args.out:
        return
    here = Path(__file__).parent
    plot(modes, here / "results" / "async_vs_sync.png")
    sched = results.get("scheduling")
    kept = kept_from_other_runs(here / "results" / "async_vs_sync.json", summary)
    multi = results.get("multitask") or kept.get("multitask")
    policies = kept.get("batch_policy")
    save("async_vs_sync", {**kept, **summary}, "Async vs sync",
         f".venv/bin/python benchmarks/async_vs_sync.py --target {args.target} "
         f"--max-iterations {args.max_iterations} --batch {args.batch} --seeds {args.seeds}",
         [f"Env latency: {LATENCY}. Rollout: `algorithm.rollout_unit = \"{ROLLOUT_UNIT}\"` "
          "(the groups started together take each turn together, in one workflow) for every "
          "mode but the *_trajectory ones, which give each trajectory its own workflow, at its "
          "own env's pace (sync_trajectory is RollArt's Sync+: async env steps within a sync "
          "step). "
          "Learning figures: the tiny model on the real engine and "
          f"trainer, {args.seeds} runs per mode (seeds 0-{args.seeds - 1}); time to score is "
          "the mean over the runs that reached the target. Curves: "
          "`results/async_vs_sync.png`.", "", *lines,
          *(["", *batch_policy_lines(policies)] if policies else []),
          *(["", *scheduling_lines(sched)] if sched else []),
          *(["", *multitask_lines(multi)] if multi else [])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=float, default=0.8)
    parser.add_argument("--max-iterations", type=int, default=30)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--seeds", type=int, default=3, help="runs per mode")
    parser.add_argument("--modes", nargs="+", default=[n for n, _ in MODES])
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a config override for every run (experiments)")
    parser.add_argument("--no-scheduling", action="store_true",
                        help="skip the trajectory- vs batch-level scheduling comparison")
    parser.add_argument("--multitask", action="store_true",
                        help="also train examples/multitask.toml and each of its domains alone")
    parser.add_argument("--multitask-only", action="store_true",
                        help="only the multitask comparison; merged into the recorded JSON")
    parser.add_argument("--multitask-runs", nargs="+", choices=list(MULTITASK_RUNS),
                        default=list(MULTITASK_RUNS), help="with --multitask-only: rerun only "
                        "these; the others stay as recorded")
    parser.add_argument("--batch-policy-only", action="store_true",
                        help="only async alpha 1 with the blocking and the streaming get_batch; "
                        "merged into the recorded JSON")
    parser.add_argument("--scheduling-only", action="store_true",
                        help="only the scheduling comparison; merged into the recorded JSON")
    parser.add_argument("--out", help="write the summary here instead of results/ (experiments)")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    arguments = parser.parse_args()
    report(asyncio.run(main(arguments)), arguments)
