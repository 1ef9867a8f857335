"""Chaos: `rollart train` itself while random workers, and the launcher, are SIGKILLed.

`rollart train` (dev server, Mooncake master, one process per worker: control, env, two
generation replicas, reward, trainer) trains FrozenLake in async mode while victims are
killed with SIGKILL one at a time, each 5-15 s after the run recovered from the last (an
iteration ended after it): a worker (its supervisor starts it again) or the launcher's whole
process group (then `rollart train --resume` brings the run back); every kind once per round.
Afterwards the run is audited from Temporal itself, on the run's own database:

- lost: trajectories started and never settled (the ledger's in-flight count at the end, plus
  trajectory and batch workflows still running) — must be 0;
- duplicated: trajectories in the train batches of two different iterations, read from the
  train.step inputs in the training workflow's histories — must be 0;
- failed_by_env_worker_death: failed trajectories (or batch members) whose env step found no
  worker (FrozenLake is deterministic, so its episodes are rebuilt instead);
- recovery: for each kill, the time until the next iteration completed.

Run: .venv/bin/python benchmarks/chaos.py [--iterations 80] [--seeds 3]
     [--rollout-unit trajectory|batch|auto] [--smoke]
(one run per seed 0..N-1; writes results/chaos.json and chaos.md beside this file, or
chaos_<unit>.* for another rollout unit; --smoke: one run of 2 iterations on simulated compute,
the launcher killed once after the first iteration and resumed, nothing written)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psutil
from report import save
from rich.console import Console
from rich.table import Table

from rollart.config import RunConfig, load_config
from rollart.contracts import TrajectoryResult
from rollart.servers import die_with_parent, free_port
from rollart.workers.audit import trained_ids_by_iteration
from rollart.workers.client import connect
from rollart.workers.devserver import DevServer

console = Console()
LAUNCHER = "launcher"
WORKERS = {"control": "--role control", "env.cpu": "--role env", "reward.cpu": "--role reward",
           "train.cpu": "--role train", "gen.cpu.r0": "--role gen --pool cpu --replica 0",
           "gen.cpu.r1": "--role gen --pool cpu --replica 1"}
LOST_ENV = ("ScheduleToStart", "no live environment")


SMOKE_SIMULATED = {"simulation.enabled": True, "simulation.time_scale": 0.02,
                   "pools": [{"name": "cpu", "role": "env"}, {"name": "cpu", "role": "reward"},
                             {"name": "cpu", "role": "train"},
                             {"name": "cpu", "role": "gen", "hardware": "h800"}]}


def chaos_config(run_dir: Path, iterations: int, smoke: bool = False,
                 rollout_unit: str = "trajectory") -> RunConfig:
    return load_config(None, **{
        "run_dir": str(run_dir),
        "temporal.address": f"127.0.0.1:{free_port()}", "temporal.ui_port": free_port(),
        "weights.mooncake_master": f"127.0.0.1:{free_port()}",
        "algorithm.group_size": 4, "algorithm.batch_size": 16, "algorithm.minibatches": 1,
        "algorithm.iterations": iterations, "algorithm.rollout_unit": rollout_unit,
        "pools": [{"name": "cpu", "role": "env"}, {"name": "cpu", "role": "reward"},
                  {"name": "cpu", "role": "train"},
                  {"name": "cpu", "role": "gen", "replicas": 2}],
        "trainer.heartbeat_s": 15, "trainer.checkpoint_every": 1,
        "routing.schedule_to_start_s": 10, "routing.down_s": 10,
        "domains.frozenlake.timeouts": {"pickup_s": 20, "step_s": 30},
        **(SMOKE_SIMULATED if smoke else {}),
    })


def launch(*args: str, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "rollart.workers.cli", "train", *args],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent)


def worker_pid(launcher: subprocess.Popen, victim: str) -> int | None:
    """The victim's worker process: the launcher's child, or the fork server's (generation
    replicas and the trainer), not a child of the worker that still carries its title."""
    found = {}
    for process in psutil.Process(launcher.pid).children(recursive=True):
        try:
            command = " ".join(process.cmdline()) + " "
            if WORKERS[victim] + " " in command:
                found[process.pid] = process.ppid()
        except psutil.Error:  # a killed worker not reaped yet
            continue
    return next((pid for pid, parent in found.items() if parent not in found), None)


def take_restarts(run_dir: Path) -> int:
    """The restarts the launcher recorded, removing its record: a resumed launcher starts its
    own."""
    path = run_dir / "supervisor.json"
    if not path.exists():
        return 0
    count = json.loads(path.read_text())["worker_restarts"]
    path.unlink()
    return count


def last_iteration_end(run_dir: Path) -> datetime | None:
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return datetime.fromisoformat(json.loads(lines[-1])["ended_at"]) if lines else None


def chaos(config_file: Path, run_dir: Path, rng: random.Random, min_gap: float,
          max_gap: float, smoke: bool) -> dict:
    """Kills one victim at a time: the next is drawn only once an iteration ended after the
    last kill (overlapping kills would charge one kill's recovery with the next one's), then a
    random gap. Victims come in shuffled rounds, so every kind is killed before any twice."""
    log = run_dir.parent / "launcher.log"
    launcher = launch("--config", str(config_file), log=log)
    kills: list[dict] = []
    restarts, resumes, victims = 0, 0, []
    started = time.monotonic()

    def wait_until(ready) -> bool:
        while not ready() and launcher.poll() is None:
            time.sleep(0.25)
        return launcher.poll() is None

    def ended_since(moment: datetime) -> bool:
        end = last_iteration_end(run_dir)
        return end is not None and end > moment

    last_kill = datetime.min.replace(tzinfo=UTC)
    while True:
        running = wait_until(lambda t=last_kill: ended_since(t))
        gap = 0.5 if smoke else rng.uniform(min_gap, max_gap)
        deadline = time.monotonic() + gap
        running = running and wait_until(lambda t=deadline: time.monotonic() >= t)
        if not running:
            if launcher.returncode != 0:
                raise RuntimeError(f"rollart train exited with {launcher.returncode}; see {log}")
            break
        if smoke and kills:
            continue
        if not victims:
            victims = [LAUNCHER] if smoke else rng.sample([LAUNCHER, *WORKERS], len(WORKERS) + 1)
        victim = victims[-1]
        last_kill = datetime.now(UTC)
        at = last_kill.isoformat()
        if victim == LAUNCHER:
            restarts += take_restarts(run_dir)
            family = psutil.Process(launcher.pid).children(recursive=True)
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
            psutil.wait_procs(family, timeout=10)  # its servers and workers die with it
            launcher = launch("--resume", str(run_dir), log=log)
            resumes += 1
        else:
            pid = worker_pid(launcher, victim)
            if pid is None:  # restarting, or the stack is still coming up
                continue
            os.killpg(pid, signal.SIGKILL)
        victims.pop()
        console.print(f"{time.monotonic() - started:6.0f}s  SIGKILL {victim}")
        kills.append({"victim": victim, "at": at})
        if time.monotonic() - started > 3600:
            raise TimeoutError("the chaos run did not finish within an hour")
    restarts += take_restarts(run_dir)
    return {"kills": kills, "launcher_kills_resumed": resumes, "worker_restarts": restarts,
            "wall_s": time.monotonic() - started}


async def audit(config: RunConfig, workflow_id: str) -> dict:
    client = await connect(config.temporal)
    batches = await trained_ids_by_iteration(client, workflow_id)
    query = (f"WorkflowType='TrajectoryWorkflow' AND WorkflowId STARTS_WITH '{workflow_id}'")
    batch_query = (f"WorkflowType='BatchRolloutWorkflow' AND WorkflowId STARTS_WITH "
                   f"'{workflow_id}'")
    running, lost_env = [], 0
    for rollouts in (query, batch_query):
        async for execution in client.list_workflows(rollouts + " AND ExecutionStatus='Running'"):
            running.append(execution.id)
    async for execution in client.list_workflows(query + " AND ExecutionStatus='Failed'"):
        history = await client.get_workflow_handle(execution.id).fetch_history()
        failure = history.events[-1].workflow_execution_failed_event_attributes.failure
        lost_env += any(marker in failure.message for marker in LOST_ENV)
    async for execution in client.list_workflows(  # a batch's trajectories fail inside it
            batch_query + " AND ExecutionStatus='Completed' AND RollartFailedIn IS NOT NULL"):
        members = await client.get_workflow_handle(
            execution.id, result_type=list[TrajectoryResult]).result()
        lost_env += sum(any(marker in (r.error or "") for marker in LOST_ENV)
                        for r in members if r.status == "failed")
    counts = Counter(tid for ids in batches.values() for tid in set(ids))
    return {"duplicated": sum(1 for n in counts.values() if n > 1), "running": running,
            "failed_by_env_worker_death": lost_env, "iterations_trained": len(batches)}


def summarize(config: RunConfig, run_dir: Path, chaos_run: dict) -> dict:
    status = json.loads((run_dir / "status.json").read_text())
    port = config.temporal.address.rsplit(":", 1)[1]
    with DevServer(run_dir / "temporal.db", int(port), None):
        audited = asyncio.run(audit(config, "rollart-train-" + run_dir.name))
    ends = sorted(datetime.fromisoformat(m["ended_at"]) for m in status["history"])
    recoveries = []
    for kill in chaos_run["kills"]:
        at = datetime.fromisoformat(kill["at"])
        after = next((e for e in ends if e > at), None)
        kill["recovery_s"] = (after - at).total_seconds() if after else None
        if after:
            recoveries.append((kill["victim"], kill["recovery_s"]))
    steps = sorted(m["step_s"] for m in status["history"])
    ledger = status["ledger"]
    in_flight = ledger["started"] - ledger["trained"] - ledger["failed"] - ledger["evicted"]
    return {
        "kills": len(chaos_run["kills"]),
        "lost": in_flight + len(audited["running"]),
        "duplicated": audited["duplicated"],
        "failed_by_env_worker_death": audited["failed_by_env_worker_death"],
        "launcher_kills_resumed": chaos_run["launcher_kills_resumed"],
        "worker_restarts": chaos_run["worker_restarts"],
        "iterations_completed": status["iteration"],
        "max_recovery_s": max((s for _, s in recoveries), default=0.0),
        "max_recovery_s_workers": max((s for v, s in recoveries if v != LAUNCHER), default=0.0),
        "max_recovery_s_launcher": max((s for v, s in recoveries if v == LAUNCHER), default=0.0),
        "median_iteration_s": steps[len(steps) // 2] if steps else 0.0,
        "ledger": ledger,
        "failures_sample": status["failures"][-5:],
        "wall_s": chaos_run["wall_s"],
        "kill_log": chaos_run["kills"],
        "final_success_rate": status["history"][-1]["success_rate"] if status["history"] else 0,
    }


SUMMED = ("kills", "lost", "duplicated", "failed_by_env_worker_death", "launcher_kills_resumed",
          "worker_restarts", "iterations_completed")


def one_run(iterations: int, seed: int, min_gap: float, max_gap: float, smoke: bool,
            rollout_unit: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="rollart-chaos-") as tmp:
        run_dir = Path(tmp) / "run"
        config = chaos_config(run_dir, iterations, smoke=smoke, rollout_unit=rollout_unit)
        config_file = Path(tmp) / "chaos.json"
        config_file.write_text(config.model_dump_json())
        chaos_run = chaos(config_file, run_dir, random.Random(seed), min_gap, max_gap, smoke)
        return {"seed": seed, **summarize(config, run_dir, chaos_run)}


def combined(runs: list[dict]) -> dict:
    """The runs' counts summed, their worst recoveries, and each run's own figures."""
    ledgers = [run["ledger"] for run in runs]
    return {
        **{key: sum(run[key] for run in runs) for key in SUMMED},
        "max_recovery_s": max(run["max_recovery_s"] for run in runs),
        "max_recovery_s_workers": max(run["max_recovery_s_workers"] for run in runs),
        "max_recovery_s_launcher": max(run["max_recovery_s_launcher"] for run in runs),
        "median_iteration_s": statistics.median(run["median_iteration_s"] for run in runs),
        "ledger": {key: sum(ledger[key] for ledger in ledgers) for key in ledgers[0]},
        "seeds": [run["seed"] for run in runs],
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=80)
    parser.add_argument("--seeds", type=int, default=3, help="runs, seeds 0..N-1")
    parser.add_argument("--min-gap", type=float, default=5)
    parser.add_argument("--max-gap", type=float, default=15)
    parser.add_argument("--rollout-unit", choices=["trajectory", "batch", "auto"],
                        default="trajectory", help="algorithm.rollout_unit")
    parser.add_argument("--smoke", action="store_true",
                        help="the smallest run of every code path (CI), nothing written")
    args = parser.parse_args()
    if args.smoke:
        args.iterations, args.seeds = 2, 1
    runs = []
    for seed in range(args.seeds):
        runs.append(one_run(args.iterations, seed, args.min_gap, args.max_gap, args.smoke,
                            args.rollout_unit))
        console.print(f"seed {seed}: max recovery {runs[-1]['max_recovery_s']:.1f} s, "
                      f"lost {runs[-1]['lost']}, duplicated {runs[-1]['duplicated']}")
    results = combined(runs)
    columns = ["seed", "kills", "lost", "duplicated", "env-death failures", "launcher resumed",
               "worker restarts", "iterations", "max recovery s (workers)",
               "max recovery s (launcher)", "median iteration s", "trained", "failed",
               "evicted"]
    table = Table(title="chaos: SIGKILL of random workers and of the launcher during training")
    for column in columns:
        table.add_column(column, justify="right")
    rows = [_row(str(run["seed"]), run) for run in runs]
    if len(runs) > 1:
        rows.append(_row("all", results))
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if args.smoke:
        return
    kill_lines = []
    for run in runs:
        kill_lines.append(f"Seed {run['seed']}:")
        kill_lines += [f"- {k['victim']}: next iteration {k['recovery_s']:.1f} s after the kill"
                       if k["recovery_s"] is not None
                       else f"- {k['victim']}: after the last iteration"
                       for k in run["kill_log"]]
    failures = [f for run in runs for f in run["failures_sample"]]
    name = "chaos" if args.rollout_unit == "trajectory" else f"chaos_{args.rollout_unit}"
    save(name, results, "Chaos: workers and the launcher killed during training",
         f".venv/bin/python benchmarks/chaos.py --iterations {args.iterations} "
         f"--seeds {args.seeds} --rollout-unit {args.rollout_unit}",
         ["System figures of the real stack under `rollart train`; a killed worker is started "
          "again by the launcher's supervisor, a killed launcher (its whole process group) by "
          "`rollart train --resume`. One victim at a time, each 5-15 s after an iteration ended "
          "after the previous kill, in shuffled rounds of every kind; one run per seed.", "",
          "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
          *("| " + " | ".join(row) + " |" for row in rows), "", *kill_lines, "",
          f"Failures (last 5 of each run): {json.dumps(failures)}"])


def _row(label: str, results: dict) -> list[str]:
    ledger = results["ledger"]
    return [label, *(str(results[k]) for k in SUMMED),
            f"{results['max_recovery_s_workers']:.1f}",
            f"{results['max_recovery_s_launcher']:.1f}", f"{results['median_iteration_s']:.1f}",
            str(ledger["trained"]), str(ledger["failed"]), str(ledger["evicted"])]


if __name__ == "__main__":
    main()
