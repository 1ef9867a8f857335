"""The `rollart` command line.

  rollart train            the embedded default: dev server + fleet workers + a training run
  rollart train --resume D continue the unfinished run in run directory D
  rollart stack            dev server + fleet workers, waiting for runs started elsewhere
  rollart worker           one fleet worker (--role env|gen|reward|train|control)
  rollart start            start a TrainingWorkflow on a running stack (the SDK path)
  rollart status [RUN]     a run's progress, live (any TrainingWorkflow on the server)
  rollart stop [RUN]       end a run gracefully: finish the iteration, evict the rest
  rollart replay ID        re-run a failed trajectory; its result re-enters the run if in time
  rollart ui RUN_DIR       reopen a finished run's histories in the Web UI
  rollart report RUN_DIR   one HTML page of a run's plots (report.html)
  rollart codec-server     decode encrypted payloads for the Web UI (temporal.encryption_key_env)
  rollart lambda-local     serve reward handlers on a local Lambda Invoke API (reward.kind lambda)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
import tomllib
from pathlib import Path
from typing import NoReturn

from pydantic import ValidationError

from rollart.config import RunConfig, load_config, parse_sets

WORKFLOW_ID_PREFIX = "rollart-train-"


def _config(args: argparse.Namespace, fresh_run_dir: bool = False) -> RunConfig:
    try:
        overrides = parse_sets(args.set or [])
    except ValueError as error:
        raise SystemExit(str(error)) from None
    if getattr(args, "run_dir", None):
        overrides["run_dir"] = args.run_dir
    try:
        config = load_config(args.config, **overrides)
    except ValidationError as err:
        raise SystemExit(f"invalid config:\n{_explain(err)}") from None
    except OSError as err:
        raise SystemExit(f"--config: cannot read {args.config}: {err.strerror or err}") from None
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as err:
        kind = "JSON" if str(args.config).endswith(".json") else "TOML"
        raise SystemExit(f"--config: {args.config} is not valid {kind}: {err}") from None
    named = "run_dir" in overrides or (args.config and "run_dir" in Path(args.config).read_text())
    if fresh_run_dir and not named:
        config.run_dir = f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    config.run_dir = str(Path(config.run_dir).resolve())
    return config


def _explain(err: ValidationError) -> str:
    lines = []
    for problem in err.errors():
        field = ".".join(str(part) for part in problem["loc"]) or "config"
        lines.append(f"  {field}: {problem['msg']}")
    return "\n".join(lines)


def _check_env_name(config: RunConfig) -> None:
    from rollart.envs import load_plugins, registered_envs
    from rollart.envs.plugins import PluginError

    try:
        load_plugins(config.plugins)
    except PluginError as err:
        raise SystemExit(f"invalid config:\n  {err}") from None
    for key, domain in config.domains.items():
        if domain.env not in registered_envs():
            raise SystemExit(f"invalid config:\n  domains.{key}.env: unknown environment "
                             f"{domain.env!r}; registered: {registered_envs()}")


def _check_engine_installed(config: RunConfig, role: str | None = None) -> None:
    """Real generation replicas and judges run vLLM, which is an extra of its own (its CPU and
    CUDA builds cannot both be installed); say which to install before any process starts."""
    import importlib.util

    judges = any(p.model for p in config.pools if p.role == "reward")
    runs_vllm = {None: True, "gen": True, "reward": judges}.get(role, False)
    if runs_vllm and not config.simulation.enabled and importlib.util.find_spec("vllm") is None:
        raise SystemExit("vLLM is not installed, and generation replicas run it: pip install "
                         "'rollart[cpu]' (its CPU build) or 'rollart[gpu]' (its CUDA build); "
                         "scripts/dev setup installs the CPU one, ROLLART_ENGINE=gpu the other")


def _write_config(config: RunConfig) -> Path:
    run_dir = Path(config.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "config.json"
    path.write_text(config.model_dump_json(indent=2))
    return path


async def _start_workflow(config: RunConfig, workflow_id: str):
    from rollart import search_attributes
    from rollart.contracts import TrainingStatus
    from rollart.workers.client import connect
    from rollart.workers.telemetry import start_tracing, temporal_interceptors
    from rollart.workflows.training import TrainingInput

    start_tracing(config, "rollart-launcher")  # flushed when the process exits
    client = await connect(config.temporal, temporal_interceptors(config))
    tags = None
    if config.temporal.search_attributes:
        try:
            await search_attributes.register(client, config.temporal.namespace)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
        tags = search_attributes.of_run(workflow_id)
    handle = await client.start_workflow(
        "TrainingWorkflow", TrainingInput(config=config), id=workflow_id,
        task_queue=config.temporal.control_queue, result_type=TrainingStatus,
        search_attributes=tags,
    )
    return client, handle


def _stop_on_sigterm() -> None:
    """`kill` stops the stack like Ctrl-C does: the context managers stop every worker."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))


def cmd_train(args: argparse.Namespace) -> int:
    from rollart.policy.model import policy_model_path
    from rollart.workers.progress import (
        console,
        follow,
        plot_curve,
        read_metrics,
        write_cpu_budget,
    )
    from rollart.workers.report import write_report
    from rollart.workers.stack import CrashLoopError, Stack

    if args.resume:
        config = _unfinished_run(Path(args.resume))
    else:
        config = _config(args, fresh_run_dir=True)
        if _unfinished(Path(config.run_dir)):
            raise SystemExit(f"{config.run_dir} holds a run that did not finish (its launcher "
                             f"stopped first); resume it with: rollart train --resume "
                             f"{config.run_dir}  (or choose another --run-dir)")
    _check_env_name(config)
    _check_engine_installed(config)
    _stop_on_sigterm()
    run_dir = Path(config.run_dir)
    with console.status("preparing the policy model"):
        model_path = policy_model_path(config)
    config_file = run_dir / "config.json" if args.resume else _write_config(config)
    console.print(f"run directory: {run_dir}\npolicy: {model_path}"
                  + ("\nresuming the run where it stopped" if args.resume else ""))
    workflow_id = WORKFLOW_ID_PREFIX + run_dir.name

    async def main():
        with Stack(config, config_file) as stack:
            console.print(f"Temporal dev server on {config.temporal.address}, Web UI on "
                          f"http://127.0.0.1:{config.temporal.ui_port}; workers: "
                          f"{', '.join(stack.processes)} (logs in {stack.logs})")
            if config.telemetry.metrics != "off":
                console.print(f"metrics: every worker's endpoints in {run_dir}/metrics/targets;"
                              f" prometheus --config.file={run_dir}/metrics/prometheus.yml")
            if args.resume:
                from rollart.contracts import TrainingStatus
                from rollart.workers.client import connect

                client = await connect(config.temporal)
                handle = client.get_workflow_handle(workflow_id, result_type=TrainingStatus)
            else:
                client, handle = await _start_workflow(config, workflow_id)

            def check() -> None:
                seen, waiting = len(stack.exits), stack.restarts_due
                try:
                    stack.supervise()
                finally:
                    for exit_ in stack.exits[seen:]:
                        console.print(f"[yellow]worker {exit_['worker']} exited with "
                                      f"{exit_['returncode']}; restarting it in "
                                      f"{exit_['restart_in_s']:.0f} s[/yellow]")
                    if len(stack.exits) > seen or stack.restarts_due < waiting:
                        stack.write_supervision(run_dir / "supervisor.json")
                cpu.update(stack.cpu_seconds())

            status = await follow(client, handle, run_dir, check=check)
            await _drain(client, workflow_id, check)
            return status, stack.restart_count

    cpu: dict[str, float] = {}
    try:
        status, restarts = asyncio.run(main())
    except CrashLoopError as err:
        raise SystemExit(f"rollart train stopped: {err}") from None
    (run_dir / "status.json").write_text(status.model_dump_json(indent=2))
    metrics = read_metrics(run_dir)
    curve = plot_curve(metrics, run_dir / "curve.png")
    report = write_report(run_dir) if metrics else None
    cpu_line = write_cpu_budget(cpu, metrics, run_dir / "cpu.json")
    last = status.history[-1] if status.history else None
    ledger = status.ledger
    console.print(
        f"\n[bold]done[/bold]: {status.iteration} iterations, policy v{status.version}"
        + (f", final success rate {last.success_rate:.2f}" if last else "")
        + f"\ntrajectories: started {ledger.started}, trained {ledger.trained}, "
        f"failed {ledger.failed}, evicted {ledger.evicted}"
        + (f" ({status.readmitted} after a re-run)" if status.readmitted else "")
        + (f"\nworkers restarted: {restarts} (supervisor.json)" if restarts else "")
        + f"\nrun directory: {run_dir}  (config.json, metrics.jsonl, status.json, "
        f"{'curve.png, ' if curve else ''}cpu.json, weights/, trajectories/, logs/)"
        + (f"\nreport: {report}" if report else "")
        + f"\nWeb UI on this run's histories: rollart ui {run_dir}  then open "
        f"http://127.0.0.1:{config.temporal.ui_port}/namespaces/default/workflows"
        + (f"\n{cpu_line}" if cpu_line else "")
    )
    return 0


async def _drain(client, workflow_id: str, check, timeout_s: float = 60) -> None:
    """Keep the fleet up until the run's trajectories that it cancelled as it ended have ended
    (a stopped fleet would leave them open in the database)."""
    query = (f"WorkflowType='TrajectoryWorkflow' AND ExecutionStatus='Running' "
             f"AND WorkflowId STARTS_WITH '{workflow_id}.'")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not [w async for w in client.list_workflows(query, limit=1)]:
            return
        check()
        await asyncio.sleep(1)


def _unfinished(run_dir: Path) -> bool:
    """A run directory whose dev server database exists but whose launcher never wrote the final
    status: its TrainingWorkflow is still open in that database."""
    return (run_dir / "temporal.db").exists() and not (run_dir / "status.json").exists()


def _unfinished_run(run_dir: Path) -> RunConfig:
    run_dir = run_dir.resolve()
    if not (run_dir / "config.json").exists():
        raise SystemExit(f"--resume: {run_dir} holds no run (no config.json)")
    if not _unfinished(run_dir):
        raise SystemExit(f"--resume: the run in {run_dir} finished (status.json) or never "
                         "started (no temporal.db); nothing to resume")
    try:
        return RunConfig.model_validate_json((run_dir / "config.json").read_text())
    except ValidationError as err:
        raise SystemExit(f"invalid config:\n{_explain(err)}") from None


def cmd_stack(args: argparse.Namespace) -> int:
    from rollart.workers.stack import CrashLoopError, Stack

    config = _config(args)
    _check_env_name(config)
    _check_engine_installed(config)
    _stop_on_sigterm()
    config_file = _write_config(config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    with Stack(config, config_file) as stack:
        print(f"stack up: Temporal {config.temporal.address}, Web UI "
              f"http://127.0.0.1:{config.temporal.ui_port}, config {config_file}; Ctrl-C stops",
              flush=True)
        try:
            while True:
                stack.supervise()
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        except CrashLoopError as err:
            raise SystemExit(f"rollart stack stopped: {err}") from None
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from rollart.workers.fleet import run_worker

    config = _config(args)
    _check_engine_installed(config, args.role)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    async def main():
        task = asyncio.ensure_future(run_worker(config, args.role, args.pool, args.replica))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(main())
    _end_without_teardown(0)


def _end_without_teardown(code: int) -> NoReturn:
    """Exit a command that used a Temporal client, once its work is done, skipping interpreter
    teardown: there the SDK's Rust threads can abort the process ("PyGILState_Release",
    temporalio/sdk-python#300; seen as SIGSEGV after `rollart stop --wait` had answered)."""
    from opentelemetry import trace

    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):  # an SDK provider: flush its spans first
        provider.shutdown()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_start(args: argparse.Namespace) -> int:
    config = _config(args)
    _check_env_name(config)

    async def main():
        workflow_id = args.workflow_id or WORKFLOW_ID_PREFIX + time.strftime("%Y%m%d-%H%M%S")
        _, handle = await _start_workflow(config, workflow_id)
        print(f"started {handle.id}")
        if args.wait:
            print((await handle.result()).model_dump_json(indent=2))

    asyncio.run(main())
    _end_without_teardown(0)


def _training_run(args: argparse.Namespace) -> tuple[RunConfig, str | None]:
    """RUN as a run directory (its config.json says where its server is; its workflow is
    rollart-train-<directory name>) or a TrainingWorkflow id (on the --config's server);
    None: the newest running TrainingWorkflow there."""
    run = args.run
    if run and (Path(run) / "config.json").is_file():
        try:
            config = RunConfig.model_validate_json((Path(run) / "config.json").read_text())
        except ValidationError as err:
            raise SystemExit(f"invalid config:\n{_explain(err)}") from None
        return config, WORKFLOW_ID_PREFIX + Path(run).resolve().name
    return _config(args), run


async def _training_handle(config: RunConfig, workflow_id: str | None):
    from rollart.contracts import TrainingStatus
    from rollart.workers.client import connect

    client = await connect(config.temporal)
    if workflow_id is None:
        query = "WorkflowType='TrainingWorkflow' AND ExecutionStatus='Running'"
        newest = [w async for w in client.list_workflows(query, limit=1)]
        if not newest:
            raise SystemExit(f"no training run is running on {config.temporal.address} (name "
                             "one: rollart status RUN_DIR or WORKFLOW_ID)")
        workflow_id = newest[0].id
    return client.get_workflow_handle(workflow_id, result_type=TrainingStatus)


def cmd_status(args: argparse.Namespace) -> int:
    """The run's progress table from its workflow (any TrainingWorkflow, started by rollart or
    the temporal CLI); on a terminal it stays live until the run ends or Ctrl-C."""
    from temporalio.service import RPCError

    from rollart.contracts import TrainingStatus
    from rollart.workers.progress import console, progress_table

    config, workflow_id = _training_run(args)

    async def main() -> int:
        handle = await _training_handle(config, workflow_id)
        started = time.monotonic()
        try:
            status = await handle.query("status", 0, result_type=TrainingStatus)
        except RPCError as err:
            raise SystemExit(f"rollart status: {handle.id}: {err.message}") from None
        if not console.is_terminal:
            console.print(progress_table(status, 0.0))
            return 0
        from rich.live import Live

        with Live(progress_table(status, 0.0), console=console, refresh_per_second=2) as live:
            while not status.done:
                await asyncio.sleep(1)
                status = await handle.query("status", 0, result_type=TrainingStatus)
                live.update(progress_table(status, time.monotonic() - started))
        return 0

    try:
        code = asyncio.run(main())
    except KeyboardInterrupt:
        code = 0
    _end_without_teardown(code)


def cmd_stop(args: argparse.Namespace) -> int:
    """Graceful: the iteration under way trains and updates the replicas, the trajectories
    still rolling out are evicted, and the run ends as when its iterations are done."""
    from rollart.workflows.training import STOP_SIGNAL

    config, workflow_id = _training_run(args)

    async def main() -> int:
        handle = await _training_handle(config, workflow_id)
        await handle.signal(STOP_SIGNAL)
        print(f"{handle.id}: stopping after the iteration under way", flush=True)
        if args.wait:
            status = await handle.result()
            print(f"{handle.id}: stopped after {status.iteration} iterations, policy "
                  f"v{status.version}", flush=True)
        return 0

    _end_without_teardown(asyncio.run(main()))


def cmd_replay(args: argparse.Namespace) -> int:
    from rollart.workers.client import connect
    from rollart.workers.replay import ReplayError, outcome, replay

    config = _config(args)

    async def main() -> int:
        try:
            client = await connect(config.temporal)
            started = await replay(client, args.workflow_id)
        except (ConnectionError, ValueError, ReplayError) as err:
            print(f"rollart replay: {err}", file=sys.stderr)
            return 1
        parent = (f"reports to {started.parent_id} "
                  f"({'running' if started.parent_running else 'ended: it will not be trained'})"
                  if started.parent_id else "belongs to no training run")
        if started.batch_id:
            print(f"{started.workflow_id} ({started.previous_status} in lockstep batch "
                  f"{started.batch_id}, run {started.failed_run_id}) re-run on its own as a "
                  f"TrajectoryWorkflow: run {started.run_id}; it {parent}", flush=True)
        else:
            print(f"{started.workflow_id} ({started.previous_status}, run "
                  f"{started.failed_run_id}) reset to its first workflow task: new run "
                  f"{started.run_id}; it {parent}", flush=True)
        if not started.workers_polling:
            print(f"warning: no worker polls {started.task_queue}; the re-run waits for one "
                  "(rollart stack, or rollart worker --role control)", file=sys.stderr)
        if args.wait:
            print(await outcome(client, started, args.timeout), flush=True)
        return 0

    return asyncio.run(main())


def cmd_ui(args: argparse.Namespace) -> int:
    from rollart.workers.devserver import DevServer

    run_dir = Path(args.run_dir).resolve()
    db = run_dir / "temporal.db"
    if not db.exists():
        raise SystemExit(f"{db} does not exist: is {run_dir} a rollart run directory?")
    with DevServer(db, args.port, args.ui_port, codec_endpoint=args.codec_endpoint):
        print(f"Web UI: http://127.0.0.1:{args.ui_port}/namespaces/default/workflows "
              "(Ctrl-C stops)", flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """One HTML page of the run's plots (also written at the end of `rollart train`)."""
    from rollart.workers.report import write_report

    try:
        print(write_report(Path(args.run_dir).resolve()))
    except FileNotFoundError as err:
        raise SystemExit(f"rollart report: {err}") from None
    return 0


def cmd_codec_server(args: argparse.Namespace) -> int:
    from rollart.workers.codec import codec_from_env, codec_server

    config = _config(args)
    try:
        codec = codec_from_env(config.temporal.encryption_key_env)
    except ValueError as err:
        raise SystemExit(f"invalid config:\n  {err}") from None
    if codec is None:
        raise SystemExit("invalid config:\n  temporal.encryption_key_env: not set, so payloads "
                         "are not encrypted and there is nothing to decode")
    origin = args.ui_origin or f"http://127.0.0.1:{config.temporal.ui_port}"
    server = codec_server(codec, args.port, origin)
    print(f"codec server on http://127.0.0.1:{args.port} for the Web UI at {origin} "
          "(set it as the UI's codec endpoint, or temporal.codec_endpoint); Ctrl-C stops",
          flush=True)
    return _serve_until_stopped(server)


def _serve_until_stopped(server) -> int:
    """A local HTTP server in the foreground until Ctrl-C or SIGTERM."""
    _stop_on_sigterm()
    try:
        server.serve_forever()
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        server.server_close()
    return 0


def cmd_lambda_local(args: argparse.Namespace) -> int:
    from rollart.workers.lambda_local import LambdaLocal, load_handler

    functions = {}
    for item in args.function:
        name, _, target = item.partition("=")
        try:
            functions[name] = load_handler(target, args.code_dir)
        except (ValueError, ImportError, AttributeError) as err:
            raise SystemExit(f"--function {item}: {err}") from None
    server = LambdaLocal(functions, args.port, concurrency=args.concurrency)
    print(f"Lambda Invoke API on {server.url} for {sorted(functions)} (set reward.endpoint_url "
          "to it); Ctrl-C stops", flush=True)
    return _serve_until_stopped(server)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollart", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error "
                        "instead of one line (anywhere on the command line)")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(sub: argparse.ArgumentParser) -> argparse.ArgumentParser:
        sub.add_argument("--config", help="TOML or JSON run config (defaults if omitted)")
        sub.add_argument("--set", action="append", metavar="KEY=VALUE",
                         help="override a config field, e.g. algorithm.iterations=5")
        return sub

    train = with_config(commands.add_parser("train", help=cmd_train.__doc__))
    train.add_argument("--run-dir")
    train.add_argument("--resume", metavar="RUN_DIR", help="continue a run whose launcher "
                       "stopped before it finished, with the same workflow, store and weights")
    train.set_defaults(func=cmd_train)
    stack = with_config(commands.add_parser("stack"))
    stack.add_argument("--run-dir")
    stack.set_defaults(func=cmd_stack)
    worker = with_config(commands.add_parser("worker"))
    worker.add_argument("--role", required=True,
                        choices=["control", "env", "gen", "reward", "train"])
    worker.add_argument("--pool", default="cpu")
    worker.add_argument("--replica", type=int, default=0)
    worker.set_defaults(func=cmd_worker)
    start = with_config(commands.add_parser("start"))
    start.add_argument("--workflow-id")
    start.add_argument("--wait", action="store_true")
    start.set_defaults(func=cmd_start)
    for name, func in (("status", cmd_status), ("stop", cmd_stop)):
        sub = with_config(commands.add_parser(name, help=func.__doc__))
        sub.add_argument("run", nargs="?", help="a run directory or a TrainingWorkflow id "
                         "(default: the newest running one on the config's server)")
        if func is cmd_stop:
            sub.add_argument("--wait", action="store_true", help="wait until it has stopped")
        sub.set_defaults(func=func)
    rerun = with_config(commands.add_parser("replay"))
    rerun.add_argument("workflow_id", help="a trajectory's id: a TrajectoryWorkflow's "
                       "(e.g. from the Web UI) or a lockstep batch's member's")
    rerun.add_argument("--wait", action="store_true",
                       help="wait for the re-run and say whether the run took its result")
    rerun.add_argument("--timeout", type=float, default=600, help="seconds --wait waits")
    rerun.set_defaults(func=cmd_replay)
    codec = with_config(commands.add_parser("codec-server"))
    codec.add_argument("--port", type=int, default=8081)
    codec.add_argument("--ui-origin", help="the Web UI's origin (default: the config's UI)")
    codec.set_defaults(func=cmd_codec_server)
    local = commands.add_parser("lambda-local")
    local.add_argument("--function", action="append", required=True, metavar="NAME=MOD:FUNC",
                       help="a function name and its handler, e.g. score=my_rewards:handler")
    local.add_argument("--code-dir", default=".", help="where handler modules are imported "
                       "from (Lambda's task root; default: here)")
    local.add_argument("--port", type=int, default=9001)
    local.add_argument("--concurrency", type=int, default=1000,
                       help="invocations at once per server; more are throttled (HTTP 429)")
    local.set_defaults(func=cmd_lambda_local)
    report = commands.add_parser("report", help=cmd_report.__doc__)
    report.add_argument("run_dir")
    report.set_defaults(func=cmd_report)
    ui = commands.add_parser("ui")
    ui.add_argument("run_dir")
    ui.add_argument("--port", type=int, default=7233)
    ui.add_argument("--ui-port", type=int, default=8233)
    ui.add_argument("--codec-endpoint", help="a `rollart codec-server`, for encrypted runs")
    ui.set_defaults(func=cmd_ui)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # anywhere on the line, before or after the command
    args = build_parser().parse_args([a for a in argv if a != "--debug"])
    try:
        return args.func(args)
    except (KeyboardInterrupt, SystemExit):
        raise
    except Exception as err:
        if debug:
            raise
        raise SystemExit(f"rollart {args.command}: {_one_line(err)}\n(--debug shows where)"
                         ) from None


def _one_line(err: BaseException) -> str:
    """The error's own words, without the chained causes' tracebacks."""
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 400 else text[:400] + " ..."


if __name__ == "__main__":
    sys.exit(main())
