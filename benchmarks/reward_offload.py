"""Where the reward model runs: on the generation replicas, on a pool of its own, or on a
serverless endpoint, with the same GPUs in the cluster (RollArt's serverless reward, R3).

System figures on simulated compute (none is a learning figure): policy replicas, judge engines
and trainer spend time by the roofline cost model of `rollart.simulation` (Qwen3-8B-sized, H800
from its data sheet). The judge is a generative reward model the policy's size that reads the
episode (`judge_prompt_tokens` simulated tokens, compute-bound prefill) and reasons
`judge_tokens` before its verdict. Everything else is real: the Temporal dev server, the
workflows, the reward activities and their queues, and for the serverless placement boto3
invoking a local Lambda Invoke API server whose handler spends the judge's time at batch 1,
plus a remote I/O overhead (lognormal, median 0.4 s, p99 2.1 s: RollArt's worst remote I/O).

Every placement has 4 H800 in the cluster:
- colocated: 4 policy replicas, each with a judge engine on its device (they take turns, as two
  processes' kernels on one GPU do);
- dedicated: 3 policy replicas and 1 judge replica (a reward pool of its own);
- dedicated_half: 2 policy replicas and 2 judge replicas, RollArt R3's own local setup (4 of
  its 8 GPUs judged), so dedicated_half vs serverless is the comparison behind its 158 s -> 77 s;
- serverless: 4 policy replicas; judges on an elastic endpoint outside the cluster, one
  instance per call, billed per call.
Sync training (the batch's rollout ends with its last reward), FrozenLake of up to 8 turns with
env steps of mean 2 s, std 1 s (simulated; tool calls), batch 32 in groups of 8.

Run: .venv/bin/python benchmarks/reward_offload.py [--iterations 4] [--smoke]
(writes results/reward_offload.json and reward_offload.md; --smoke: smallest sizes, nothing
written)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from report import save
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from rollart.activities.reward_model import JUDGE
from rollart.config import RunConfig, SimulationConfig
from rollart.contracts import TrainingStatus
from rollart.servers import free_port
from rollart.simulation.costs import CostModel
from rollart.workers.devserver import DevServer
from rollart.workers.fleet import in_process_fleet
from rollart.workers.lambda_local import LambdaLocal
from rollart.workflows.training import TrainingInput, TrainingWorkflow

TIME_SCALE = 0.15  # wall seconds per simulated second
BATCH, GROUP = 32, 8
GPUS = 4
ENV_MEAN_S, ENV_STD_S = 2.0, 1.0  # simulated seconds per env step
OVERHEAD_MEDIAN_S, OVERHEAD_P99_S = 0.4, 2.1  # simulated remote I/O of one serverless call
VERDICTS = {"Right": 1.0, "Left": 0.0}  # one token each for the tiny tokenizer
POLICY_REPLICAS = {"colocated": GPUS, "dedicated": GPUS - 1, "dedicated_half": GPUS // 2,
                   "serverless": GPUS}  # the dedicated placements' judges take the rest
PLACEMENTS = list(POLICY_REPLICAS)
# light: a judge reading an 8k-token episode and reasoning 512 tokens; heavy: a long agentic
# episode (32k tokens) judged by a reasoning reward model (2k tokens), RollArt's regime where
# the reward burst at the end of a batch is long next to the rollout.
WORKLOADS = {"light": {"judge_prompt_tokens": 8192, "judge_tokens": 512},
             "heavy": {"judge_prompt_tokens": 32768, "judge_tokens": 2048}}
HERE = Path(__file__).parent
console = Console()


def judge_s(sim: SimulationConfig) -> float:
    """One verdict alone on an H800 (simulated seconds): chunked prefill, then decode."""
    cost = CostModel(sim, sim.hardware["h800"])
    prefill, done, seconds = sim.judge_prompt_tokens, 0.0, 0.0
    while prefill > 0:
        chunk = min(prefill, sim.prefill_chunk)
        seconds += cost.step_s(chunk, done)
        prefill, done = prefill - chunk, done + chunk
    return seconds + sim.judge_tokens * cost.step_s(1, done)


class ServerlessJudge:
    """The endpoint's handler: the judge's time at batch 1 plus remote I/O, in wall time. It
    reports both as its own time (`compute_s`, as a function's billed duration includes the I/O
    it waits on), so what rollart measures beyond it is the real boto3 and HTTP round trip."""

    def __init__(self, sim: SimulationConfig) -> None:
        self.compute_s = judge_s(sim)
        self.sigma = math.log(OVERHEAD_P99_S / OVERHEAD_MEDIAN_S) / 2.326
        self.rng, self.lock = random.Random(0), threading.Lock()
        self.calls = 0

    def __call__(self, event: dict, context: object) -> dict:
        with self.lock:
            overhead = self.rng.lognormvariate(math.log(OVERHEAD_MEDIAN_S), self.sigma)
            reward = self.rng.random()
            self.calls += 1
        time.sleep((self.compute_s + overhead) * TIME_SCALE)
        return {"reward": reward, "success": reward >= 0.5,
                "compute_s": (self.compute_s + overhead) * TIME_SCALE}


def placement_config(server: DevServer, work: Path, placement: str, iterations: int,
                     endpoint: str, judge: dict) -> RunConfig:
    gen_replicas = POLICY_REPLICAS[placement]
    pools = [{"name": "cpu", "role": role} for role in ("env", "reward", "train")]
    pools.append({"name": "h800", "role": "gen", "hardware": "h800", "replicas": gen_replicas})
    reward = {"kind": "model", "verdicts": VERDICTS}
    if placement == "colocated":
        pools.append({"name": "judge", "role": "reward", "model": "policy",
                      "colocate_with": "h800", "concurrency": 64})
    elif placement.startswith("dedicated"):
        pools.append({"name": "judge", "role": "reward", "model": "policy", "hardware": "h800",
                      "replicas": GPUS - gen_replicas, "concurrency": 64})
    else:
        pools.append({"name": "judge", "role": "reward", "concurrency": 256})
        reward = {"kind": "lambda", "function": "judge", "endpoint_url": endpoint,
                  "timeout_s": 50}
    faults = {"step_mean_s": ENV_MEAN_S * TIME_SCALE, "step_std_s": ENV_STD_S * TIME_SCALE}
    data = {"temporal": {"address": server.address}, "run_dir": str(work / placement),
            "weights": {"backend": "local"}, "pools": pools,
            "domains": {"frozenlake": {"gen_pool": "h800", "reward_pool": "judge",
                                       "max_turns": 8, "faults": faults, "reward": reward}},
            "simulation": {"enabled": True, "time_scale": TIME_SCALE, **judge},
            "trainer": {"checkpoint_every": 0},
            "algorithm": {"mode": "sync", "group_size": GROUP, "batch_size": BATCH,
                          "minibatches": 1, "iterations": iterations,
                          "rollout_unit": "trajectory"}}
    return RunConfig.model_validate(data)


async def run_placement(server: DevServer, work: Path, placement: str, iterations: int,
                        endpoint: LambdaLocal, serverless: ServerlessJudge, judge: dict) -> dict:
    config = placement_config(server, work, placement, iterations, endpoint.url, judge)
    calls_before = serverless.calls
    async with in_process_fleet(config) as client:
        judges = [engine for engine, _ in JUDGE.engines]
        started = time.perf_counter()
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config),
            id=f"reward-{work.name}-{placement}",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        wall = time.perf_counter() - started
        judge_busy = [engine.busy_s for engine in judges]
    history = status.history
    judge_device_s = (sum(judge_busy) if judges
                      else (serverless.calls - calls_before) * serverless.compute_s * TIME_SCALE)
    rewards = [m.rewards[config.domains["frozenlake"].reward.kind] for m in history]
    return {
        "iterations": status.iteration, "trained": status.ledger.trained,
        "failed": status.ledger.failed, "wall_s": wall,
        "rollout_s_simulated": statistics.fmean(m.rollout_s for m in history) / TIME_SCALE,
        "rollout_s_simulated_per_iteration": [m.rollout_s / TIME_SCALE for m in history],
        "reward_latency_s_p99_simulated": max(r.latency_s_p99 for r in rewards) / TIME_SCALE,
        "reward_latency_s_p50_simulated": statistics.median(r.latency_s_p50 for r in rewards)
        / TIME_SCALE,
        "remote_overhead_s_p99": max(r.remote_overhead_s_p99 for r in rewards),
        "judge_engines": len(judges),
        "judge_device_s_per_iteration": judge_device_s / TIME_SCALE / status.iteration,
        "judge_busy_share": sum(judge_busy) / (len(judges) * wall) if judges else None,
        "reward_slot_busy_share": statistics.fmean(r.busy_share for r in rewards),
    }


async def main(args: argparse.Namespace) -> dict:
    global TIME_SCALE, BATCH
    if args.smoke:
        TIME_SCALE, BATCH = TIME_SCALE / 5, 16
        del WORKLOADS["heavy"]
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "local")  # the local endpoint signs nothing
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "local")
    iterations = 1 if args.smoke else args.iterations
    work = Path(tempfile.mkdtemp(prefix="rollart-reward-"))
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    results: dict = {}
    try:
        with Progress(console=console) as progress:
            task = progress.add_task("placements", total=len(PLACEMENTS) * len(WORKLOADS))
            for workload, judge in WORKLOADS.items():
                serverless = ServerlessJudge(SimulationConfig(**judge))
                endpoint = LambdaLocal({"judge": serverless}).start()
                try:
                    for placement in PLACEMENTS:
                        progress.update(task, description=f"{workload} judge, {placement}")
                        results.setdefault(workload, {})[placement] = await run_placement(
                            server, work / workload, placement, iterations, endpoint,
                            serverless, judge)
                        progress.advance(task)
                finally:
                    endpoint.shutdown()
    finally:
        server.stop()
    return results


def summarize(runs: dict, iterations: int) -> dict:
    def ratio(workload: str, slow: str, fast: str) -> float:
        return (runs[workload][slow]["rollout_s_simulated"]
                / runs[workload][fast]["rollout_s_simulated"])

    return {
        "rollout_time_ratio_colocated_vs_offloaded": {
            w: ratio(w, "colocated", "serverless") for w in runs},
        "rollout_time_ratio_dedicated_vs_offloaded": {
            w: ratio(w, "dedicated", "serverless") for w in runs},
        "rollout_time_ratio_dedicated_half_vs_offloaded": {
            w: ratio(w, "dedicated_half", "serverless") for w in runs},
        "rollout_time_ratio_colocated_vs_dedicated": {
            w: ratio(w, "colocated", "dedicated") for w in runs},
        "reward_pool_busy_share": {w: {name: r["judge_busy_share"] for name, r in placed.items()}
                                   for w, placed in runs.items()},
        "remote_overhead_s_p99": max(placed["serverless"]["remote_overhead_s_p99"]
                                     for placed in runs.values()),
        "cost_model": {"time_scale": TIME_SCALE, "workloads": {
            w: {**judge, "judge_s_alone_on_h800": judge_s(SimulationConfig(**judge))}
            for w, judge in WORKLOADS.items()},
            "remote_overhead_median_s": OVERHEAD_MEDIAN_S,
            "remote_overhead_p99_s": OVERHEAD_P99_S, "gpus": GPUS,
            "env_step_mean_s": ENV_MEAN_S, "env_step_std_s": ENV_STD_S,
            "batch": BATCH, "group": GROUP, "iterations": iterations},
        "runs": runs,
    }


def report(summary: dict, args: argparse.Namespace) -> None:
    columns = ["judge", "placement", "policy replicas", "rollout s", "x serverless",
               "reward p50 s", "reward p99 s", "judge busy share", "judge GPU-s / iter",
               "trained", "failed"]
    table = Table(title="reward placement (simulated compute, system figures)")
    for column in columns:
        table.add_column(column, justify="right")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for workload, runs in summary["runs"].items():
        for name, r in runs.items():
            busy = r["judge_busy_share"]
            row = [workload, name, str(POLICY_REPLICAS[name]),
                   f"{r['rollout_s_simulated']:.1f}",
                   f"{r['rollout_s_simulated'] / runs['serverless']['rollout_s_simulated']:.2f}",
                   f"{r['reward_latency_s_p50_simulated']:.1f}",
                   f"{r['reward_latency_s_p99_simulated']:.1f}",
                   "billed per call" if busy is None else f"{busy:.2f}",
                   f"{r['judge_device_s_per_iteration']:.0f}", str(r["trained"]),
                   str(r["failed"])]
            table.add_row(*row)
            lines.append("| " + " | ".join(row) + " |")
    console.print(table)
    console.print(f"serverless remote overhead p99: {summary['remote_overhead_s_p99']:.2f} s "
                  "(real, wall)")
    if args.smoke:
        return
    workloads = summary["cost_model"]["workloads"]
    judges = "; ".join(f"{w}: reads {j['judge_prompt_tokens']} tokens and reasons "
                       f"{j['judge_tokens']} ({j['judge_s_alone_on_h800']:.1f} s alone on an "
                       "H800)" for w, j in workloads.items())
    save("reward_offload", summary, "Reward placement: colocated, dedicated (1 or half the "
         "GPUs), serverless",
         f".venv/bin/python benchmarks/reward_offload.py --iterations {args.iterations}",
         ["System figures (simulated compute; time scale "
          f"{TIME_SCALE} wall s per simulated s; seconds below are simulated). "
          f"{GPUS} H800 in the cluster in every placement: colocated, 4 policy replicas each "
          "sharing its device with a judge engine; dedicated, 3 policy replicas and 1 judge; "
          "dedicated_half, 2 policy replicas and 2 judges (RollArt R3's local setup: 4 of 8 "
          "GPUs judged, and 158 s -> 77 s is that setup against serverless); "
          "serverless, 4 policy replicas and judges outside the cluster, one instance per "
          f"call. The judge is 8B ({judges}); serverless calls add remote I/O of median "
          f"{OVERHEAD_MEDIAN_S} s, p99 {OVERHEAD_P99_S} s. Sync training, batch {BATCH} in "
          f"groups of {GROUP}, FrozenLake up to 8 turns, env steps mean {ENV_MEAN_S:.0f} s "
          f"std {ENV_STD_S:.0f} s; {args.iterations} iterations each. Rollout s: mean per "
          "iteration, from its start to its last reward. Judge busy share: the judge engines' "
          "busy time over the run's wall time (colocated: their share of the policy replicas' "
          "devices). Judge GPU-s: device seconds spent judging per iteration (serverless: "
          "calls x the verdict's time alone, as billed).", "", *lines, "",
          f"Remote overhead p99 of the serverless calls: "
          f"{summary['remote_overhead_s_p99']:.2f} s, real and in wall seconds (not "
          "simulated): a call's time beyond the handler's own (judge and injected I/O), i.e. "
          "rollart's boto3 and HTTP round trip on loopback with every core busy. The injected "
          f"network I/O (p99 {OVERHEAD_P99_S} s simulated) comes on top of it."])


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    measured = asyncio.run(main(args))
    report(summarize(measured, 1 if args.smoke else args.iterations), args)
