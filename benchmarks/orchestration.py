"""What Temporal orchestration costs a rollout, against the same work done directly, and where a
turn's CPU goes, process by process.

On the embedded stack exactly as `rollart train` starts it (dev server on SQLite, one process per
fleet worker, the vLLM engine in the generation worker), side by side with a plain loop in this
process that drives its own engine through the same per-turn work (encode, generate, store write,
env step, decode):
  0. the floor: Temporal's own cost on this dev server, from no-op activities (latency of one at
     a time; steps/s and the server's CPU per step with 64 workflows at once; turns/s of 64
     workflows whose turns are two no-op activities, and with the env step a local activity);
  1. latency: one 50-turn trajectory vs the same 50 turns in the loop -> overhead per turn;
  2. throughput: 64 concurrent 10-turn trajectories vs 64 concurrent loops -> turns/s; and
     the 64 as one lockstep batch (rollout_unit "batch": one generate and one env activity a
     turn for all of them);
  3. a default training run on a trajectory store pre-filled with 100,000 turn records: rollout
     turns/s over its last iterations against its first, the split of an iteration, and CPU
     milliseconds per turn for every process of the stack (rollart train's own accounting).
All figures are system figures of the real stack on this machine (no simulated compute).

Run: .venv/bin/python benchmarks/orchestration.py [--iterations 30] [--smoke]
(writes results/orchestration.json and orchestration.md beside this file; --smoke runs every
phase at toy sizes and writes nothing)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import psutil
from report import save
from rich.console import Console
from rich.table import Table
from temporalio import activity, workflow
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from rollart.config import RunConfig, load_config
from rollart.contracts import TrainingStatus, TrajectoryResult, TrajectorySpec
from rollart.envs import make_env
from rollart.policy.engine import PolicyEngine
from rollart.policy.model import resolve_model_path
from rollart.servers import free_port
from rollart.store import TrajectoryStore, TurnRecord
from rollart.workers.client import connect
from rollart.workers.progress import turns_per_s, turns_served
from rollart.workers.stack import Stack
from rollart.workflows.batch_rollout import BatchRolloutWorkflow
from rollart.workflows.training import TrainingInput, TrainingWorkflow
from rollart.workflows.trajectory import TrajectoryWorkflow

console = Console()
FULL = {"latency_turns": 50, "concurrent": 64, "concurrent_turns": 10, "noop_steps": 20,
        "prefill": 100_000, "window": 5}
SMOKE = {"latency_turns": 4, "concurrent": 4, "concurrent_turns": 3, "noop_steps": 3,
         "prefill": 1_000, "window": 1}
SMOKE_TRAINING = {"algorithm.batch_size": 16, "algorithm.group_size": 4,
                  "algorithm.minibatches": 1}
# CPU ms per turn, by process, of a 15-iteration default run on the code before the CPU budget
# (commit 54abf87; `rollart train --set algorithm.iterations=15`, 4,424 turns, 7.5 minutes).
BEFORE_CPU_MS_PER_TURN = {
    "temporal dev server": 47.9, "control": 23.9, "gen.cpu.r0 (frontend)": 23.3,
    "gen.cpu.r0 vLLM engine core + worker": 93.5, "train.cpu": 16.4, "env.cpu": 3.2,
    "reward.cpu": 0.8, "mooncake master": 0.3,
}


# What the CPU budget changed or left, each measured once on this 2-core machine (2026-12-01).
FINDINGS = [
    "Dev server dispatch: the history service polls its transfer queue at most 20 times a "
    "second by default, so every activity and workflow task waited ~35 ms before dispatch: a "
    "no-op activity one after another took 87 ms, 18 ms with "
    "`history.transferProcessorMaxPollRPS = 1000` (rollart.workers.devserver).",
    "Task queue partitions: a task queue has 4 by default, and a task written to one no "
    "poller waits on is forwarded to the root partition. One partition on the one-process dev "
    "server (rollart.workers.devserver), measured the same morning (2026-12-07) with this "
    "script's latency phase, 50-turn trajectories: 31-35 ms of overhead a turn over 4 runs "
    "with 4 partitions, 24-28 ms over 3 with 1, and the dev server's CPU per turn 26-31 -> "
    "20-22 ms. That machine ran 2-3x faster than on 2026-12-06 (the direct loop's 64 "
    "concurrent trajectories: 2,285 turns/s against 705): compare rows within one run.",
    "vLLM on a CPU host runs the model in a worker process of its own by default, whose "
    "shared-memory queue to the engine core busy-loops a second after every message: that "
    "worker used 28 ms of CPU per request at one request every 20 ms (7 ms when it slept in "
    "1 ms slices, the first fix). Now the model runs in the engine core's process (the "
    "\"uni\" executor; rollart.policy.engine): one request every 20 ms, engine and frontend "
    "together, 15.5 -> 9.9 ms of CPU and 13.1 -> 9.0 ms median latency per request, and the "
    "engine serves its first token 24 s after start instead of 40 s (one process fewer to "
    "import torch and vLLM).",
    "Workflow sandbox: 24% of the control worker's samples (py-spy) ran inside it; off by "
    "default now (`temporal.workflow_sandbox`), on in the tests: control 23.9 -> 15.6 ms of "
    "CPU per turn.",
    "Trainer threads: torch's default (2) against the rollout on 2 cores made a train step "
    "4.5 s; 1 thread: 2 s (`trainer.threads` defaults to half the cores).",
    "Kept: SQLite persistence with WAL and synchronous=normal. The dev server's CPU per no-op "
    "activity: 12.7 ms in memory, 11.8 ms WAL + normal, 10.8 ms WAL + off (off can corrupt the "
    "run's database on a crash); history.enableTransitionHistory and history.enableChasm off "
    "changed nothing; schedule-to-start and heartbeat timeouts cost 0.9 ms per activity.",
    "One replica in all: a turn no longer asks the router (two local activities, two history "
    "markers): 12 history events and 2,108 bytes a turn instead of 14 and 2,910; control "
    "19.0 -> 13.1 ms of CPU per turn (2026-12-03, on a machine whose floor was 1.8x slower "
    "that day: a no-op activity 31.5 ms one at a time instead of 17.7).",
    "Lockstep batches (`algorithm.rollout_unit = \"batch\"`): 64 trajectories take one "
    "generate activity per replica and one env activity per env worker a turn, 200-211 "
    "turns/s over 2 runs (2026-12-06), ~6x the per-trajectory workflows; a trajectory whose "
    "env raises or hangs fails alone and the rest of the batch goes on.",
    "Left: 12 history events a turn (two activities, two workflow tasks) on the "
    "per-trajectory path, still the default. The dev server's CPU per activity and its "
    "workflow task (5-21 ms, by the day's machine) is the floor of that design on one small "
    "machine: two activities a turn cap it at about half the floor's no-op activities/s "
    "(87-272) before any other work, whatever rollart does. Measured directly since "
    "2026-12-07: 64 workflows whose turns are two no-op activities run 125 turns/s here, and "
    "158 with the env step a local activity of the workflow's worker (one activity and one "
    "workflow task a turn fewer; not adopted: it would take env steps off the env fleet's "
    "queues). Neither reaches 200 turns/s on this machine with no work in a turn.",
]


@activity.defn(name="bench.noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="BenchNoops", sandboxed=False)
class Noops:
    """`steps` no-op activities one after another: what Temporal itself costs per step."""

    @workflow.run
    async def run(self, steps: int) -> int:
        for step in range(steps):
            await workflow.execute_activity("bench.noop", step, task_queue="bench.noop",
                                            start_to_close_timeout=timedelta(seconds=30))
        return steps


@workflow.defn(name="BenchNoopTurns", sandboxed=False)
class NoopTurns:
    """`turns` turns of a trajectory's shape with no work in them: a no-op activity on one
    queue (generate) then one on another (env step), or, `local_step`, the step as a local
    activity of the workflow's own worker (one activity and one workflow task a turn fewer)."""

    @workflow.run
    async def run(self, turns: int, local_step: bool) -> int:
        for turn in range(turns):
            await workflow.execute_activity("bench.noop", turn, task_queue="bench.noop",
                                            start_to_close_timeout=timedelta(seconds=30))
            if local_step:
                await workflow.execute_local_activity(
                    "bench.noop", turn, start_to_close_timeout=timedelta(seconds=30))
            else:
                await workflow.execute_activity("bench.noop", turn, task_queue="bench.noop.step",
                                                start_to_close_timeout=timedelta(seconds=30))
        return turns


def spec(config: RunConfig, tid: str, turns: int) -> TrajectorySpec:
    return TrajectorySpec.for_domain(config, "frozenlake", tid, tid, seed=0).model_copy(
        update={"env_name": "corridor", "max_turns": turns})


async def direct_trajectory(engine: PolicyEngine, store: TrajectoryStore, tid: str,
                            turns: int) -> None:
    """The baseline: a turn's work as the activities do it (the context kept in memory, as the
    replica keeps it), in a plain loop."""
    env = make_env("corridor")
    observation, _ = env.reset(0)
    allowed = engine.single_token_ids(env.action_vocabulary)
    context: list[int] = []
    for turn in range(turns):
        observation_ids = engine.encode(observation)
        context = context + observation_ids
        sample = await engine.generate(context, max_tokens=1, temperature=1.0,
                                       allowed_token_ids=allowed)
        store.write_turn(tid, TurnRecord(turn=turn, observation_ids=observation_ids,
                                         sampled_ids=sample.token_ids, logprobs=sample.logprobs,
                                         versions=sample.versions, allowed_ids=allowed))
        context = context + sample.token_ids
        observation = env.step(engine.decode(sample.token_ids)).observation


def prefill(store_dir: Path, records: int) -> None:
    """Turn records of finished 10-turn trajectories, as a long run leaves them."""
    record = TurnRecord(turn=0, observation_ids=[5, 6, 7, 8], sampled_ids=[3], logprobs=[-1.4],
                        versions=[0], allowed_ids=[3, 4, 5, 6]).model_dump_json().encode()
    for t in range(records // 10):
        directory = store_dir / f"earlier-{t:06d}"
        directory.mkdir(parents=True)
        for turn in range(10):
            (directory / f"turn_{turn:05d}.json").write_bytes(record)


async def floor(client, server_pid: int, sizes: dict) -> dict:
    server = psutil.Process(server_pid)
    async with Worker(client, task_queue="bench.noop", activities=[noop],
                      max_concurrent_activities=200), \
            Worker(client, task_queue="bench.noop.step", activities=[noop],
                   max_concurrent_activities=200), \
            Worker(client, task_queue="bench.noops", workflows=[Noops, NoopTurns],
                   activities=[noop], workflow_runner=UnsandboxedWorkflowRunner()):
        await client.execute_workflow(Noops.run, 3, id="noops-warm", task_queue="bench.noops")
        started = time.perf_counter()
        await client.execute_workflow(Noops.run, sizes["noop_steps"], id="noops-one",
                                      task_queue="bench.noops")
        one_s = (time.perf_counter() - started) / sizes["noop_steps"]
        cpu, started = sum(server.cpu_times()[:2]), time.perf_counter()
        await asyncio.gather(*(client.execute_workflow(Noops.run, sizes["noop_steps"],
                                                       id=f"noops-{i}", task_queue="bench.noops")
                               for i in range(sizes["concurrent"])))
        steps = sizes["concurrent"] * sizes["noop_steps"]
        wall = time.perf_counter() - started
        server_s = sum(server.cpu_times()[:2]) - cpu
        turns_per_s = {}
        for local_step in (False, True):
            started = time.perf_counter()
            await asyncio.gather(*(client.execute_workflow(
                NoopTurns.run, args=[sizes["noop_steps"], local_step],
                id=f"noop-turns-{local_step}-{i}", task_queue="bench.noops")
                for i in range(sizes["concurrent"])))
            turns_per_s[local_step] = steps / (time.perf_counter() - started)
    return {"noop_activity_ms": 1000 * one_s, "noop_activities_per_s": steps / wall,
            "server_cpu_ms_per_noop_activity": 1000 * server_s / steps,
            "floor_turns_per_s": turns_per_s[False],
            "floor_local_step_turns_per_s": turns_per_s[True]}


async def main(args: argparse.Namespace) -> dict:
    sizes = SMOKE if args.smoke else FULL
    work = Path(tempfile.mkdtemp(prefix="rollart-bench-"))
    config = load_config(None, **{
        "run_dir": str(work / "run"), "temporal.address": f"127.0.0.1:{free_port()}",
        "temporal.ui_port": free_port(), "weights.mooncake_master": f"127.0.0.1:{free_port()}",
        "algorithm.iterations": args.iterations, "algorithm.rollout_unit": "trajectory",
        **(SMOKE_TRAINING if args.smoke else {})})  # the per-trajectory path's cost over a run
    prefill(Path(config.store_dir), sizes["prefill"])
    config_file = work / "config.json"
    config_file.write_text(config.model_dump_json())
    results: dict = {"prefilled_records": sizes["prefill"]}
    with Stack(config, config_file) as stack:
        client = await connect(config.temporal)
        queue = config.temporal.control_queue
        with console.status("the stack's generation replica is starting"):
            await client.execute_workflow(TrajectoryWorkflow.run, spec(config, "warm", 3),
                                          id="warm", task_queue=queue)
        results.update(await floor(client, stack.server.process.pid, sizes))
        engine = await PolicyEngine(resolve_model_path(None), config.engine).start()
        try:
            store = TrajectoryStore(str(work / "direct"))
            await direct_trajectory(engine, store, "warm-direct", 3)
            console.print("1. latency")
            turns = sizes["latency_turns"]
            started = time.perf_counter()
            await client.execute_workflow(TrajectoryWorkflow.run, spec(config, "latency", turns),
                                          id="latency", task_queue=queue)
            workflow_s = time.perf_counter() - started
            started = time.perf_counter()
            await direct_trajectory(engine, store, "latency-direct", turns)
            direct_s = time.perf_counter() - started
            results["workflow_ms_per_turn"] = 1000 * workflow_s / turns
            results["direct_ms_per_turn"] = 1000 * direct_s / turns
            results["per_turn_overhead_ms"] = (results["workflow_ms_per_turn"]
                                               - results["direct_ms_per_turn"])

            console.print("2. throughput")
            many, turns = sizes["concurrent"], sizes["concurrent_turns"]
            started = time.perf_counter()
            await asyncio.gather(*(
                client.execute_workflow(TrajectoryWorkflow.run, spec(config, f"many-{i}", turns),
                                        id=f"many-{i}", task_queue=queue,
                                        result_type=TrajectoryResult)
                for i in range(many)))
            many_s = time.perf_counter() - started
            results["turns_per_s"] = many * turns / many_s
            results["activities_per_s"] = many * (2 * turns + 3) / many_s  # reset, close, reward
            started = time.perf_counter()
            await asyncio.gather(*(direct_trajectory(engine, store, f"many-direct-{i}", turns)
                                   for i in range(many)))
            results["direct_turns_per_s"] = many * turns / (time.perf_counter() - started)
            started = time.perf_counter()
            await client.execute_workflow(
                BatchRolloutWorkflow.run,
                [spec(config, f"batch-{i}", turns) for i in range(many)], id="batch",
                task_queue=queue, result_type=list[TrajectoryResult])
            results["batch_turns_per_s"] = many * turns / (time.perf_counter() - started)
        finally:
            engine.shutdown()

        console.print(f"3. a {args.iterations}-iteration training run on a store of "
                      f"{sizes['prefill']:,} earlier turn records")
        before = stack.cpu_seconds()
        handle = await client.start_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="train", task_queue=queue,
            result_type=TrainingStatus)
        result = asyncio.ensure_future(handle.result())
        while not result.done():
            stack.cpu_seconds()  # keeps a reading of any process that exits meanwhile
            await asyncio.wait([result], timeout=1.0)
        status, after = result.result(), stack.cpu_seconds()
    history = status.history
    turns = turns_served(history)
    used = {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}
    results["cpu_s_per_turn"] = {name: seconds / turns for name, seconds in
                                 sorted(used.items(), key=lambda item: -item[1])}
    results["training_turns"] = turns
    results["failed_trajectories"] = status.ledger.failed
    window = sizes["window"]
    early, late = history[1:1 + window], history[-window:]
    results["early_turns_per_s"] = turns_per_s(early)
    results["late_turns_per_s"] = turns_per_s(late)
    results["late_vs_early_turns_per_s"] = (results["late_turns_per_s"]
                                            / results["early_turns_per_s"])
    steps = sum(m.step_s for m in history)
    results["rollout_share"] = sum(m.rollout_s for m in history) / steps
    results["train_share"] = sum(m.train_s for m in history) / steps
    results["weight_update_share"] = sum(m.weight_update_s for m in history) / steps
    results["iteration_s"] = steps / len(history)
    return results


ROWS = [
    ("no-op activity, one at a time (ms) [floor]", "noop_activity_ms", ".1f"),
    ("no-op activities/s, 64 workflows at once [floor]", "noop_activities_per_s", ".0f"),
    ("dev server CPU per no-op activity (ms) [floor]", "server_cpu_ms_per_noop_activity", ".1f"),
    ("no-op turns/s (two activities), 64 workflows at once [floor]", "floor_turns_per_s",
     ".0f"),
    ("same, the env step a local activity [floor]", "floor_local_step_turns_per_s", ".0f"),
    ("per-turn latency, workflow (ms)", "workflow_ms_per_turn", ".1f"),
    ("per-turn latency, direct loop (ms)", "direct_ms_per_turn", ".1f"),
    ("per-turn orchestration overhead (ms)", "per_turn_overhead_ms", ".1f"),
    ("turns/s through Temporal, 64 concurrent trajectories", "turns_per_s", ".1f"),
    ("activities/s, same", "activities_per_s", ".1f"),
    ("turns/s direct loop, 64 concurrent", "direct_turns_per_s", ".0f"),
    ("turns/s through Temporal, the 64 as one lockstep batch", "batch_turns_per_s", ".1f"),
    ("training: rollout turns/s, first iterations", "early_turns_per_s", ".1f"),
    ("training: rollout turns/s, last iterations", "late_turns_per_s", ".1f"),
    ("late / early (store pre-filled)", "late_vs_early_turns_per_s", ".2f"),
    ("training: failed trajectories", "failed_trajectories", "d"),
    ("iteration wall time (s), default batch", "iteration_s", ".1f"),
    ("rollout share of an iteration", "rollout_share", ".2f"),
    ("train share", "train_share", ".2f"),
    ("weight update share", "weight_update_share", ".3f"),
]


def report(results: dict, args: argparse.Namespace) -> None:
    table = Table(title="rollart orchestration (2-core CPU, embedded stack, dev server on SQLite)")
    table.add_column("measure")
    table.add_column("value", justify="right")
    lines = ["| measure | value |", "|---|---:|"]
    for label, key, fmt in ROWS:
        table.add_row(label, format(results[key], fmt))
        lines.append(f"| {label} | {format(results[key], fmt)} |")
    console.print(table)
    cpu = Table(title=f"CPU ms per turn, {results['training_turns']} turns of training")
    cpu.add_column("process")
    cpu.add_column("ms per turn", justify="right")
    cpu_lines = ["", "## CPU per turn, by process", "",
                 f"Training run of {args.iterations} iterations, {results['training_turns']} "
                 "turns, on a store pre-filled with "
                 f"{results['prefilled_records']:,} turn records.", "",
                 "| process | CPU ms per turn |", "|---|---:|"]
    for name, seconds in results["cpu_s_per_turn"].items():
        if seconds >= 0.0001:
            cpu.add_row(name, f"{1000 * seconds:.1f}")
            cpu_lines.append(f"| {name} | {1000 * seconds:.1f} |")
    total = 1000 * sum(results["cpu_s_per_turn"].values())
    cpu.add_row("all", f"{total:.1f}")
    cpu_lines.append(f"| all | {total:.1f} |")
    console.print(cpu)
    cpu_lines += ["", "Before the CPU budget (commit 54abf87, a 15-iteration default run, "
                  "`rollart train --set algorithm.iterations=15`):", "",
                  "| process | CPU ms per turn |", "|---|---:|"]
    cpu_lines += [f"| {name} | {ms:.1f} |" for name, ms in BEFORE_CPU_MS_PER_TURN.items()]
    cpu_lines.append(f"| all | {sum(BEFORE_CPU_MS_PER_TURN.values()):.1f} |")
    cpu_lines += ["", "## What the CPU budget changed, and left", ""]
    cpu_lines += [f"- {finding}" for finding in FINDINGS]
    if args.smoke:
        return
    command = ".venv/bin/python benchmarks/orchestration.py" + (
        f" --iterations {args.iterations}" if args.iterations != 30 else "")
    save("orchestration", results, "Orchestration benchmark", command, lines + cpu_lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="toy sizes; writes nothing")
    args = parser.parse_args()
    if args.smoke:
        args.iterations = 2
    return args


if __name__ == "__main__":
    arguments = parse_args()
    report(asyncio.run(main(arguments)), arguments)
