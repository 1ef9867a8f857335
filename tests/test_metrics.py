"""Metrics and dashboards: a short real `rollart train` (tiny model, vLLM engine, dev server,
worker processes) scraped by a real Prometheus server (Debian's package) on loopback, and every
panel of every dashboard in dashboards/ queried against what it scraped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import make_config
from prometheus_client.parser import text_string_to_metric_families

from rollart.contracts import TrainingStatus
from rollart.metrics import CountedTotals
from rollart.servers import free_port
from rollart.workers.fleet import in_process_fleet
from rollart.workers.telemetry import SCRAPE_CONFIG
from rollart.workflows.training import TrainingInput, TrainingWorkflow

DASHBOARDS = Path(__file__).parents[1] / "dashboards"
CONFIG = """
run_dir = "{run_dir}"
[temporal]
address = "127.0.0.1:{port}"
ui_port = {ui_port}
[weights]
backend = "local"
[telemetry]
metrics = "prometheus"
[algorithm]
mode = "async"
staleness = 1
group_size = 4
batch_size = 16
minibatches = 1
iterations = 5
[trainer]
checkpoint_every = 0
[sampling]
constrain_to_actions = false   # free text, so speculation has drafts to verify
max_tokens_per_turn = 6
[domains.frozenlake]
max_turns = 4
[domains.frozenlake.faults]
reset_failure_rate = 0.1       # some trajectories fail, for the failures panel
[domains.frozenlake.timeouts]
attempts = 1
[[pools]]
name = "cpu"
role = "env"
[[pools]]
name = "cpu"
role = "gen"
[pools.speculation]
max_running_requests = 64
[[pools]]
name = "cpu"
role = "reward"
[[pools]]
name = "cpu"
role = "train"
"""


def query_range(prometheus: str, expr: str, start: float, end: float) -> list[dict]:
    params = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": 2})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{params}", timeout=30) as r:
        answer = json.load(r)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def panel_queries() -> list[tuple[str, str, str]]:
    """(dashboard, panel, PromQL with the dashboard's variables filled in) for every target."""
    queries = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel["targets"]:
                expr = (target["expr"].replace("$__rate_interval", "30s")
                        .replace('"$run"', '".*"').replace('"$worker"', '".*"'))
                queries.append((path.stem, panel["title"], expr))
    return queries


def scrape(run_dir: Path, worker: str) -> dict[tuple[str, frozenset], float]:
    """The worker's rollart endpoint, as announced in the run directory: sample -> value."""
    target = json.loads((run_dir / "metrics" / "targets" / f"{worker}.json").read_text())
    address = next(t["targets"][0] for t in target if t["labels"]["exporter"] == "rollart")
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(sample.name, frozenset((k, v) for k, v in sample.labels.items()
                                    if not k.startswith("otel_scope"))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_an_export_that_runs_again_counts_nothing_twice():
    counted = CountedTotals()
    assert counted.gain("run", "chain-1", "trained", 8) == 8
    assert counted.gain("run", "chain-1", "trained", 8) == 0  # the same workflow task again
    assert counted.gain("run", "chain-1", "trained", 11, baseline=8) == 3
    assert counted.gain("run", "chain-1", "started", 4) == 4  # each key on its own
    assert counted.gain("other", "chain-2", "trained", 2) == 2  # each run on its own
    # A new process starts from what the workflow's state says was counted before it:
    assert CountedTotals().gain("run", "chain-1", "trained", 11, baseline=8) == 3
    # A new run under the same id counts from its own start:
    assert counted.gain("run", "chain-3", "trained", 5) == 5


async def test_the_metrics_count_what_the_ledger_counts(temporal_server, tmp_path):
    """Simulated compute, real workflows: each iteration and trajectory counted once."""
    config = make_config(temporal_server, tmp_path, **{
        "telemetry.metrics": "prometheus", "simulation.enabled": True,
        "simulation.time_scale": 0.01, "algorithm.mode": "async", "algorithm.group_size": 4,
        "pools": [{"name": "cpu", "role": r} for r in ("env", "reward", "train")]
        + [{"name": "cpu", "role": "gen", "hardware": "h800"}],
        "algorithm.batch_size": 8, "algorithm.minibatches": 1, "algorithm.iterations": 3,
        "trainer.checkpoint_every": 0,
        "domains.frozenlake.faults": {"reset_failure_rate": 0.15},
        "domains.frozenlake.timeouts": {"attempts": 1}})
    async with in_process_fleet(config) as client:
        status = await client.execute_workflow(
            TrainingWorkflow.run, TrainingInput(config=config), id="metered",
            task_queue=config.temporal.control_queue, result_type=TrainingStatus)
        samples = scrape(tmp_path, "in-process")

    def value(name: str, **labels: str) -> float:
        return samples.get((name, frozenset({"run": "metered", **labels}.items())), 0.0)

    ledger = status.ledger
    assert value("rollart_iterations_total") == 3
    for outcome in ("started", "trained", "evicted"):
        assert value("rollart_trajectories_total", outcome=outcome) == getattr(ledger, outcome)
    assert value("rollart_version_lag_count") == ledger.trained
    assert value("rollart_policy_version") == status.version == 3
    assert value("rollart_trajectories_in_flight") == 0
    failed = sum(v for (name, labels), v in samples.items()
                 if name == "rollart_trajectory_failures_total" and ("run", "metered") in labels)
    assert failed == ledger.failed > 0  # every one, the last iteration's stragglers too
    steps = sum(v for (name, labels), v in samples.items()
                if name == "rollart_env_seconds_count" and ("op", "step") in labels)
    assert steps >= ledger.trained  # every trained trajectory took at least one step
    assert not (tmp_path / "metrics" / "targets" / "in-process.json").exists()


def test_the_dashboards_are_what_their_builder_writes():
    built = subprocess.run([sys.executable, str(DASHBOARDS / "build.py"), "--check"],
                           capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    queries = panel_queries()
    assert {board for board, _, _ in queries} == {"training", "rollout", "fleets"}
    assert not [expr for _, _, expr in queries if "$" in expr]  # every variable is filled in


@pytest.mark.slow
def test_every_dashboard_panel_has_data_from_a_real_run_scraped_by_prometheus(tmp_path):
    binary = shutil.which("prometheus")
    assert binary, "this test needs Debian's prometheus (scripts/dev test installs it)"
    run_dir = tmp_path / "run"
    scrape_dir = run_dir / "metrics"
    scrape_dir.mkdir(parents=True)
    (scrape_dir / "prometheus.yml").write_text(SCRAPE_CONFIG.format(interval="1s"))
    address = f"127.0.0.1:{free_port()}"
    prometheus = subprocess.Popen(
        [binary, f"--config.file={scrape_dir / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address={address}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("wb"))
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(run_dir=run_dir, port=free_port(), ui_port=free_port()))
    try:
        start = time.time()
        train = subprocess.run([sys.executable, "-m", "rollart.workers.cli", "train",
                                "--config", str(config)], capture_output=True, text=True,
                               timeout=480)
        assert train.returncode == 0, train.stderr[-3000:]
        end = time.time()
        status = json.loads((run_dir / "status.json").read_text())
        assert status["ledger"]["failed"] > 0  # the failures panel has something to show
        missing = [(board, panel, expr) for board, panel, expr in panel_queries()
                   if not any(value != "NaN" for series in
                              query_range(f"http://{address}", expr, start, end)
                              for _, value in series["values"])]
        assert not missing, missing
        workers = {series["metric"]["worker"] for series in query_range(
            f"http://{address}", 'up{exporter="rollart"}', start, end)}
        assert {"control", "env.cpu", "gen.cpu.r0", "reward.cpu", "train.cpu"} <= workers
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
    assert not list((scrape_dir / "targets").glob("*.json"))  # each worker withdrew its own
