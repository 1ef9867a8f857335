"""Following a run from the outside: progress on the terminal, metrics.jsonl and a curve."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

from rich import box
from rich.console import Console
from rich.live import Live
from rich.table import Table
from temporalio.client import Client, WorkflowHandle

from rollart.contracts import IterationMetrics, TrainingStatus

QUERY_TIMEOUT = timedelta(seconds=10)  # progress only: a late answer is dropped

console = Console()


COLUMNS = ("iter", "reward", "succ", "step s", "idle", "train", "upd", "tok/s", "lag", "stale",
           "loss")


def progress_table(status: TrainingStatus, elapsed_s: float) -> Table:
    """The last 8 iterations in 80 columns; per-domain success and replicas in the caption."""
    ledger = status.ledger
    table = Table(title=f"rollart {status.mode} (alpha {status.alpha})  iteration "
                        f"{status.iteration}/{status.iterations}  v{status.version}  "
                        f"{elapsed_s:.0f}s", box=box.SIMPLE_HEAD, padding=(0, 1),
                  collapse_padding=True, pad_edge=False, show_edge=False,
                  caption_justify="left")
    for column in COLUMNS:
        table.add_column(column, justify="right", no_wrap=True)
    for m in status.history[-8:]:
        table.add_row(*_cells(m))
    table.caption = (f"trajectories  started {ledger.started}  trained {ledger.trained}  "
                     f"failed {ledger.failed}  evicted {ledger.evicted}  "
                     f"running {ledger.in_flight}")
    if status.history:
        last = status.history[-1]
        if len(last.domains) > 1:
            table.caption += "\nsuccess by domain  " + "  ".join(
                f"{name} {d.success_rate:.2f}" for name, d in last.domains.items())
        table.caption += "\n" + replica_summary(last)
    return table


def _cells(m: IterationMetrics) -> list[str]:
    return [str(m.iteration), f"{m.reward_mean:.3f}", f"{m.success_rate:.2f}",
            f"{m.step_s:.1f}", f"{m.trainer_idle_s:.1f}", f"{m.train_s:.1f}",
            f"{m.weight_update_s:.2f}", f"{m.tokens_per_s:.0f}", f"{m.lag_mean:.1f}",
            f"{m.stale_token_share:.2f}", f"{m.loss:.3f}"]


def iteration_line(m: IterationMetrics) -> str:
    """One iteration as one plain line, for logs (output that is not a terminal)."""
    fields = " ".join(f"{name.replace(' ', '_')}={value}"
                      for name, value in zip(COLUMNS, _cells(m), strict=True))
    domains = " ".join(f"succ[{name}]={d.success_rate:.2f}" for name, d in m.domains.items()
                       if len(m.domains) > 1)
    failures = " ".join(f"failed[{reason}]={n}" for reason, n in m.failures.items())
    return " ".join(part for part in ("rollart", fields, domains, failures) if part)


def replica_summary(metrics: IterationMetrics) -> str:
    """One line per replica: requests in flight, prefix-cache hit rate, tokens/s."""
    lines = [f"{queue.removeprefix('rollart.gen.')}: {r.in_flight_mean:.0f} in flight (max "
             f"{r.in_flight_max}, queued {r.queue_depth_max}), cache hit "
             f"{r.cache_hit_rate:.2f}, {r.tokens_per_s:.0f} tok/s"
             for queue, r in metrics.replicas.items()]
    lines += [f"{queue.removeprefix('rollart.gen.')}: DOWN (missed update)"
              for queue in metrics.missed_updates]
    fallback = sum(d.fallback_turns for d in metrics.domains.values())
    if fallback:
        lines.append(f"{fallback} turns served by fallback pools")
    return "\n".join(lines)


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
    terminal = console.is_terminal

    def show(status: TrainingStatus, written: int) -> int:
        """Append the new iterations to metrics.jsonl and show them: the live table on a
        terminal, one line each otherwise (a log file, a pipe)."""
        fresh = [m for m in status.history if m.iteration >= written]
        with metrics_file.open("a") as out:
            for m in fresh:
                out.write(m.model_dump_json() + "\n")
        if terminal:
            live.update(progress_table(status, loop.time() - started))
        for m in [] if terminal else fresh:
            print(iteration_line(m), flush=True)
        return written + len(fresh)

    try:
        with Live(console=console, refresh_per_second=2) if terminal else \
                contextlib.nullcontext() as live:
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
                    written = show(status, written)
                await asyncio.wait([result_task, checking], timeout=poll_s,
                                   return_when=asyncio.FIRST_COMPLETED)
            status = result_task.result()
            show(status, written)
    finally:
        checking.cancel()
    return status


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
