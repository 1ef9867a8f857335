"""What Temporal orchestration costs a rollout, measured against the same work run directly.

Side by side in one process, on the real dev server (SQLite file, as `rollart train` runs it) and
the real vLLM engine:
  1. latency: one 50-turn trajectory as a TrajectoryWorkflow vs the same 50 turns in a plain loop
     (same engine, same store writes, same env) -> per-turn orchestration overhead;
  2. throughput: 64 concurrent 10-turn trajectories -> activities/s and generation tokens/s;
  3. a short default training run -> the share of an iteration in rollout, train, weight update.

Run: .venv/bin/python benchmarks/orchestration.py   (writes results/orchestration.json and
orchestration.md beside this file)
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path

from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import load_config
from rollart.contracts import TrainingStatus, TrajectoryResult, TrajectorySpec
from rollart.envs import make_env
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.store import TrajectoryStore, TurnRecord
from rollart.workers.devserver import DevServer, free_port
from rollart.workers.fleet import in_process_fleet
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

LATENCY_TURNS = 50
CONCURRENT, CONCURRENT_TURNS = 64, 10
TRAIN_ITERATIONS = 3
console = Console()



def spec(config, tid: str, turns: int) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, "frozenlake", tid, tid, seed=0).model_copy(
        update={"env_name": "corridor", "max_turns": turns})


async def direct_trajectory(engine: PolicyEngine, store: TrajectoryStore, tid: str,
                            turns: int) -> None:
    """The baseline: the same per-turn work as the workflow's activities, in a plain loop."""
    env = make_env("corridor")
    observation, _ = env.reset(0)
    allowed = engine.single_token_ids(env.action_vocabulary)
    for turn in range(turns):
        observation_ids = engine.encode(observation)
        context = store.context_ids(tid, turn) + observation_ids
        sample = await engine.generate(context, max_tokens=1, temperature=1.0,
                                       allowed_token_ids=allowed)
        store.write_turn(tid, TurnRecord(turn=turn, observation_ids=observation_ids,
                                         sampled_ids=sample.token_ids, logprobs=sample.logprobs,
                                         versions=sample.versions, allowed_ids=allowed))
        observation = env.step(engine.decode(sample.token_ids)).observation


async def main() -> dict:
    work = Path(tempfile.mkdtemp(prefix="rollart-bench-"))
    results: dict[str, float] = {}
    server = DevServer(work / "temporal.db", port=free_port(), ui_port=None).start()
    engine = await PolicyEngine(resolve_model_path(None), load_config(None).engine).start()
    try:
        config = load_config(None, **{"temporal.address": server.address,
                                      "run_dir": str(work / "run")})
        store = TrajectoryStore(config.store_dir)
        async with in_process_fleet(config, engine) as client:
            queue = config.temporal.control_queue
            # 1. latency, after one warm-up trajectory each way
            await client.execute_workflow(TrajectoryWorkflow.run, spec(config, "warm", 3),
                                          id="warm", task_queue=queue)
            await direct_trajectory(engine, store, "warm-direct", 3)
            started = time.perf_counter()
            await client.execute_workflow(TrajectoryWorkflow.run,
                                          spec(config, "latency", LATENCY_TURNS),
                                          id="latency", task_queue=queue)
            workflow_s = time.perf_counter() - started
            started = time.perf_counter()
            await direct_trajectory(engine, store, "latency-direct", LATENCY_TURNS)
            direct_s = time.perf_counter() - started
            results["workflow_ms_per_turn"] = 1000 * workflow_s / LATENCY_TURNS
            results["direct_ms_per_turn"] = 1000 * direct_s / LATENCY_TURNS
            results["per_turn_overhead_ms"] = (results["workflow_ms_per_turn"]
                                               - results["direct_ms_per_turn"])

            # 2. throughput
            started = time.perf_counter()
            outcomes = await asyncio.gather(*(
                client.execute_workflow(TrajectoryWorkflow.run,
                                        spec(config, f"many-{i}", CONCURRENT_TURNS),
                                        id=f"many-{i}", task_queue=queue,
                                        result_type=TrajectoryResult)
                for i in range(CONCURRENT)))
            many_s = time.perf_counter() - started
            activities = CONCURRENT * (2 * CONCURRENT_TURNS + 3)  # + reset, close, reward
            results["activities_per_s"] = activities / many_s
            results["generation_tokens_per_s"] = sum(o.generated_tokens for o in outcomes) / many_s
            results["turns_per_s"] = CONCURRENT * CONCURRENT_TURNS / many_s
            started = time.perf_counter()
            await asyncio.gather(*(direct_trajectory(engine, store, f"many-direct-{i}",
                                                     CONCURRENT_TURNS)
                                   for i in range(CONCURRENT)))
            results["direct_turns_per_s"] = CONCURRENT * CONCURRENT_TURNS / (
                time.perf_counter() - started)

            # 3. iteration shares of a short default training run
            train_config = config.model_copy(deep=True)
            train_config.algorithm.iterations = TRAIN_ITERATIONS
            status = await client.execute_workflow(
                TrainingWorkflow.run, TrainingInput(config=train_config), id="train",
                task_queue=queue, result_type=TrainingStatus)
            steps = sum(m.step_s for m in status.history)
            results["rollout_share"] = sum(m.rollout_s for m in status.history) / steps
            results["train_share"] = sum(m.train_s for m in status.history) / steps
            results["weight_update_share"] = sum(m.weight_update_s for m in status.history) / steps
            results["iteration_s"] = steps / len(status.history)
    finally:
        engine.shutdown()
        server.stop()
    return results


def report(results: dict) -> None:
    rows = [
        ("per-turn latency, workflow (ms)", "workflow_ms_per_turn"),
        ("per-turn latency, direct loop (ms)", "direct_ms_per_turn"),
        ("per-turn orchestration overhead (ms)", "per_turn_overhead_ms"),
        ("activities/s (64 concurrent trajectories)", "activities_per_s"),
        ("turns/s through Temporal", "turns_per_s"),
        ("turns/s direct loop", "direct_turns_per_s"),
        ("generation tokens/s during rollout", "generation_tokens_per_s"),
        ("iteration wall time (s), default batch", "iteration_s"),
        ("rollout share of an iteration", "rollout_share"),
        ("train share", "train_share"),
        ("weight update share", "weight_update_share"),
    ]
    table = Table(title="rollart orchestration (2-core CPU, dev server on SQLite)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    lines = ["| measure | value |", "|---|---:|"]
    for label, key in rows:
        table.add_row(label, f"{results[key]:.3f}")
        lines.append(f"| {label} | {results[key]:.3f} |")
    ratio = results["direct_turns_per_s"] / results["turns_per_s"]
    table.caption = f"direct loop / Temporal throughput: {ratio:.1f}x"
    lines.append(f"\nDirect loop over Temporal throughput: {ratio:.1f}x.")
    console.print(table)
    save("orchestration", results, "Orchestration benchmark",
         ".venv/bin/python benchmarks/orchestration.py", lines)


if __name__ == "__main__":
    report(asyncio.run(main()))
