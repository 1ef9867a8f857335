"""Chaos: a real training run while random workers are SIGKILLed and restarted.

The embedded stack (dev server, Mooncake master, one process per worker: control, env, two
generation replicas, reward, trainer) trains FrozenLake in async mode while, every 15-35 s, one
random worker is killed with SIGKILL and started again a few seconds later. Afterwards the run is
audited from Temporal itself:

- lost: trajectories started and never settled (the ledger's in-flight count at the end, plus
  trajectory workflows still running) — must be 0;
- duplicated: trajectories in the train batches of two different iterations, read from the
  train.step inputs in the training workflow's histories — must be 0;
- recovery: for each kill, the time until the next iteration completed.

Run: .venv/bin/python benchmarks/chaos.py [--iterations 12] [--seed 0] [--smoke]
(writes results/chaos.json and chaos.md beside this file; --smoke: 2 iterations, one kill
after 30 s, nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import load_config
from rollart.contracts import TrainingStatus
from rollart.servers import free_port
from rollart.workers.audit import trained_ids_by_iteration
from rollart.workers.client import connect
from rollart.workers.stack import Stack
from rollart.workflows.training import TrainingInput

console = Console()
WORKFLOW_ID = "chaos-run"


def chaos_config(run_dir: Path, iterations: int):
    return load_config(None, **{
        "run_dir": str(run_dir),
        "temporal.address": f"127.0.0.1:{free_port()}", "temporal.ui_port": free_port(),
        "weights.mooncake_master": f"127.0.0.1:{free_port()}",
        "algorithm.group_size": 4, "algorithm.batch_size": 16, "algorithm.minibatches": 1,
        "algorithm.iterations": iterations,
        "pools": [{"name": "cpu", "role": "env"}, {"name": "cpu", "role": "reward"},
                  {"name": "cpu", "role": "train"},
                  {"name": "cpu", "role": "gen", "replicas": 2}],
        "trainer.heartbeat_s": 15, "trainer.checkpoint_every": 1,
        "routing.schedule_to_start_s": 10, "routing.down_s": 10,
        "domains.frozenlake.timeouts": {"pickup_s": 20, "step_s": 30},
    })


async def chaos(config, config_file: Path, rng: random.Random, min_gap: float,
                max_gap: float, max_kills: int | None) -> dict:
    kills: list[dict] = []
    with Stack(config, config_file) as stack:
        client = await connect(config.temporal)
        handle = await client.start_workflow(
            "TrainingWorkflow", TrainingInput(config=config), id=WORKFLOW_ID,
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        result = asyncio.ensure_future(handle.result())
        victims = sorted(stack.commands)
        started = time.monotonic()
        while not result.done() and (max_kills is None or len(kills) < max_kills):
            await asyncio.wait([result], timeout=rng.uniform(min_gap, max_gap))
            if result.done():
                break
            victim = rng.choice(victims)
            stack.kill(victim)
            killed_at = datetime.now(UTC)
            console.print(f"{time.monotonic() - started:6.0f}s  SIGKILL {victim}")
            await asyncio.sleep(rng.uniform(1, 5))
            stack.spawn(victim)
            kills.append({"victim": victim, "at": killed_at.isoformat()})
            if time.monotonic() - started > 3600:
                raise TimeoutError("the chaos run did not finish within an hour")
        status = await result
        wall = time.monotonic() - started
        batches = await trained_ids_by_iteration(client, WORKFLOW_ID)
        running = await still_running(client)
    counts = Counter(tid for ids in batches.values() for tid in set(ids))
    ends = sorted(m.ended_at for m in status.history)
    recoveries = []
    for kill in kills:
        at = datetime.fromisoformat(kill["at"])
        after = next((e for e in ends if e > at), None)
        kill["recovery_s"] = (after - at).total_seconds() if after else None
        if after:
            recoveries.append(kill["recovery_s"])
    steps = [m.step_s for m in status.history]
    return {
        "kills": len(kills),
        "lost": status.ledger.in_flight + len(running),
        "duplicated": sum(1 for n in counts.values() if n > 1),
        "iterations_completed": status.iteration,
        "max_recovery_s": max(recoveries, default=0.0),
        "median_iteration_s": sorted(steps)[len(steps) // 2] if steps else 0.0,
        "ledger": status.ledger.model_dump(),
        "failures_sample": status.failures[-5:],
        "wall_s": wall,
        "kill_log": kills,
        "final_success_rate": status.history[-1].success_rate if status.history else 0.0,
    }


async def still_running(client, wait_s: float = 60) -> list[str]:
    """This run's trajectory workflows not ended yet. One the training run cancelled as it ended
    is counted (evicted) but may still be ending, its own activities cancelled first (one on a
    replica just killed), so those get `wait_s` to end before they count as lost."""
    query = (f"WorkflowType='TrajectoryWorkflow' AND ExecutionStatus='Running' "
             f"AND WorkflowId STARTS_WITH '{WORKFLOW_ID}'")
    deadline = time.monotonic() + wait_s
    while True:
        running = [w.id async for w in client.list_workflows(query)]
        if not running or time.monotonic() > deadline:
            return running
        await asyncio.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--min-gap", type=float, default=15)
    parser.add_argument("--max-gap", type=float, default=35)
    parser.add_argument("--max-kills", type=int, help="stop killing after this many")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args = parser.parse_args()
    if args.smoke:
        args.iterations, args.min_gap, args.max_gap, args.max_kills = 2, 30, 30, 1
    with tempfile.TemporaryDirectory(prefix="rollart-chaos-") as tmp:
        config = chaos_config(Path(tmp) / "run", args.iterations)
        Path(config.run_dir).mkdir(parents=True)
        config_file = Path(config.run_dir) / "config.json"
        config_file.write_text(config.model_dump_json())
        results = asyncio.run(chaos(config, config_file, random.Random(args.seed),
                                    args.min_gap, args.max_gap, args.max_kills))
    table = Table(title="chaos: SIGKILL and restart of random workers during training")
    for column in ("kills", "lost", "duplicated", "iterations", "max recovery s",
                   "median iteration s", "trained", "failed", "evicted"):
        table.add_column(column, justify="right")
    ledger = results["ledger"]
    row = [str(results["kills"]), str(results["lost"]), str(results["duplicated"]),
           str(results["iterations_completed"]), f"{results['max_recovery_s']:.1f}",
           f"{results['median_iteration_s']:.1f}", str(ledger["trained"]),
           str(ledger["failed"]), str(ledger["evicted"])]
    table.add_row(*row)
    console.print(table)
    if args.smoke:
        return
    kill_lines = [f"- {k['victim']}: next iteration {k['recovery_s']:.1f} s after the kill"
                  if k["recovery_s"] is not None else f"- {k['victim']}: after the last iteration"
                  for k in results["kill_log"]]
    save("chaos", results, "Chaos: workers killed during training",
         f"python benchmarks/chaos.py --iterations {args.iterations} --seed {args.seed}",
         ["| " + " | ".join(c.header for c in table.columns) + " |",
          "|" + "---|" * len(row), "| " + " | ".join(row) + " |", "", "Kills:", *kill_lines,
          "", f"Failures (last 5): {json.dumps(results['failures_sample'])}"])


if __name__ == "__main__":
    main()
