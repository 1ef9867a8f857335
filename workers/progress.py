"""Following a run from the outside: progress on the terminal, metrics.jsonl and a curve."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio.client import Client, WorkflowHandle

from rollart.contracts import IterationMetrics, TrainingStatus

QUERY_TIMEOUT = timedelta(seconds=10)  # progress only: a late answer is dropped

console = Console()


def _table(status: TrainingStatus, elapsed_s: float) -> Table:
    ledger = status.ledger
    table = Table(title=f"rollart  {status.mode} (alpha {status.alpha})  iteration "
                        f"{status.iteration}/{status.iterations}  policy v{status.version}  "
                        f"{elapsed_s:.0f}s")
    for column in ("iter", "reward", "success", "by domain", "step s", "idle s", "train s",
                   "update s", "tok/s", "lag", "stale tok", "loss"):
        table.add_column(column, justify="right")
    for m in status.history[-8:]:
        by_domain = " ".join(f"{name} {d.success_rate:.2f}" for name, d in m.domains.items())
        table.add_row(str(m.iteration), f"{m.reward_mean:.3f}", f"{m.success_rate:.2f}",
                      by_domain, f"{m.step_s:.1f}", f"{m.trainer_idle_s:.1f}",
                      f"{m.train_s:.1f}", f"{m.weight_update_s:.2f}", f"{m.tokens_per_s:.0f}",
                      f"{m.lag_mean:.1f}", f"{m.stale_token_share:.2f}", f"{m.loss:.3f}")
    table.caption = (f"trajectories started {ledger.started}  trained {ledger.trained}  "
                     f"failed {ledger.failed}  evicted {ledger.evicted}  "
                     f"in flight {ledger.in_flight}")
    if status.history:
        table.caption += "\n" + replica_summary(status.history[-1])
    return table


def replica_summary(metrics: IterationMetrics) -> str:
    """One line per replica: requests in flight, prefix-cache hit rate, tokens/s."""
    parts = [f"{queue.removeprefix('rollart.gen.')}: in flight {r.in_flight_mean:.0f} "
             f"(max {r.in_flight_max}, queued max {r.queue_depth_max}), cache hit "
             f"{r.cache_hit_rate:.2f}, {r.tokens_per_s:.0f} tok/s"
             for queue, r in metrics.replicas.items()]
    parts += [f"{queue.removeprefix('rollart.gen.')}: DOWN (missed update)"
              for queue in metrics.missed_updates]
    fallback = sum(d.fallback_turns for d in metrics.domains.values())
    if fallback:
        parts.append(f"{fallback} turns served by fallback pools")
    return "replicas  " + "  |  ".join(parts)


async def follow(client: Client, handle: WorkflowHandle, run_dir: Path, poll_s: float = 1.0,
                 check: Callable[[], None] = lambda: None) -> TrainingStatus:
    """Show progress until the workflow ends; append each iteration to metrics.jsonl. Queries go
    to the latest run, so progress continues across continue-as-new. `check` (the supervisor)
    runs every poll_s on its own: a query waits for the control worker, which may be the very
    worker it has to restart (measured: a killed control worker restarted 31 s late)."""
    latest = client.get_workflow_handle(handle.id)
    metrics_file = run_dir / "metrics.jsonl"
    written = len(read_metrics(run_dir))  # a resumed run has written some already
    loop = asyncio.get_running_loop()
    started = loop.time()
    result_task = asyncio.ensure_future(handle.result())
    checking = asyncio.ensure_future(_every(poll_s, check))
    status = None
    try:
        with Live(console=console, refresh_per_second=2) as live:
            while not result_task.done():
                query = asyncio.ensure_future(latest.query(  # the table shows the last 8
                    "status", max(written - 8, 0), result_type=TrainingStatus,
                    rpc_timeout=QUERY_TIMEOUT))
                await asyncio.wait([query, checking, result_task],
                                   return_when=asyncio.FIRST_COMPLETED)
                if checking.done():
                    checking.result()  # the supervisor's CrashLoopError
                # None: the workflow has not run its first task yet, or the control worker is down
                status = None
                if not query.done():
                    query.cancel()
                elif not query.cancelled() and query.exception() is None:
                    status = query.result()
                if status is not None:
                    written = _append_new(metrics_file, status, written)
                    live.update(_table(status, loop.time() - started))
                await asyncio.wait([result_task, checking], timeout=poll_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            status = result_task.result()
            _append_new(metrics_file, status, written)
            live.update(_table(status, loop.time() - started))
    finally:
        checking.cancel()
    return status


def _append_new(metrics_file: Path, status: TrainingStatus, written: int) -> int:
    """Appends the iterations from `written` on; returns how many the file holds now."""
    fresh = [m for m in status.history if m.iteration >= written]
    with metrics_file.open("a") as out:
        for m in fresh:
            out.write(m.model_dump_json() + "\n")
    return written + len(fresh)


async def _every(seconds: float, call: Callable[[], None]) -> None:
    while True:
        call()
        await asyncio.sleep(seconds)


def read_metrics(run_dir: Path) -> list[IterationMetrics]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [IterationMetrics.model_validate(json.loads(line)) for line in lines if line.strip()]


def turns_served(metrics: list[IterationMetrics]) -> int:
    """Generate requests the replicas served over these iterations (each a turn)."""
    return sum(r.requests for m in metrics for r in m.replicas.values())


def turns_per_s(metrics: list[IterationMetrics]) -> float:
    """Rollout rate over these iterations: turns served per second of iteration wall time
    (rollout overlaps the train step in the asynchronous modes, so wall time is the clock)."""
    seconds = sum(m.step_s for m in metrics)
    return turns_served(metrics) / seconds if seconds else 0.0


def write_cpu_budget(cpu_s: dict[str, float], metrics: list[IterationMetrics],
                     out: Path) -> str:
    """Write where the run's CPU went, start-up included (seconds and ms per turn, by
    process); returns a line saying so, or "" when there is nothing to say."""
    turns = turns_served(metrics)
    if not cpu_s or not turns:
        return ""
    per_turn = {name: 1000 * seconds / turns for name, seconds in sorted(
        cpu_s.items(), key=lambda item: -item[1])}
    out.write_text(json.dumps({"turns": turns, "cpu_s": cpu_s, "cpu_ms_per_turn": per_turn},
                              indent=2) + "\n")
    shown = ", ".join(f"{name} {ms:.1f}" for name, ms in per_turn.items() if ms >= 0.5)
    return f"CPU per turn, start-up included ({turns} turns, ms): {shown}  ({out.name})"


def plot_curve(metrics: list[IterationMetrics], out: Path) -> Path | None:
    if not metrics:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    elapsed, clock = [], 0.0
    for m in metrics:
        clock += m.step_s
        elapsed.append(clock / 60)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(elapsed, [m.success_rate for m in metrics], marker="o", label="success rate")
    domains = sorted({name for m in metrics for name in m.domains})
    if len(domains) > 1:
        for name in domains:
            ax.plot(elapsed, [m.domains[name].success_rate if name in m.domains else None
                              for m in metrics], linestyle=":", label=f"success: {name}")
    ax.plot(elapsed, [m.reward_mean for m in metrics], linestyle="--", label="mean reward")
    ax.set_xlabel("training wall time (min)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("rollart: batch success rate (sampled rollouts)")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
