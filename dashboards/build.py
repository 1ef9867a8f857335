"""Writes the Grafana dashboards beside this file from the panel lists below (edit here, then
run `python dashboards/build.py`; `--check` fails when a JSON file is not what this writes).

Every query reads a metric rollart or the Temporal SDK exports (rollart.metrics;
`tests/test_metrics.py` runs each against a real Prometheus that scraped a real run).
Variables: `datasource` (a Prometheus data source), `run` (training workflow ids) and `worker`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUN = 'run=~"$run"'
WORKER = 'worker=~"$worker"'
RATE = "[$__rate_interval]"


def quantiles(metric: str, by: str, selector: str = "") -> list[tuple[str, str]]:
    """p50 and p99 of a histogram, by a label."""
    return [(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}"
             f"{RATE})))", f"{{{{{by}}}}} p{round(q * 100)}") for q in (0.5, 0.99)]


def ratio(numerator: str, denominator: str, by: str) -> str:
    return (f"sum by ({by}) (rate({numerator}{RATE})) / "
            f"sum by ({by}) (rate({denominator}{RATE}))")


TRAINING = ("training", "rollart: training", [
    ("Step time by phase", "s", [(f"rollart_step_phase_seconds{{{RUN}}}", "{{phase}}")]),
    ("Success rate by domain", "percentunit",
     [(f"rollart_success_rate{{{RUN}}}", "{{domain}}")]),
    ("Mean reward by domain", "none", [(f"rollart_reward_mean{{{RUN}}}", "{{domain}}")]),
    ("Trajectories per minute by outcome", "none",
     [(f"60 * sum by (outcome) (rate(rollart_trajectories_total{{{RUN}}}{RATE}))",
       "{{outcome}}"),
      (f"60 * sum by (reason) (rate(rollart_trajectory_failures_total{{{RUN}}}{RATE}))",
       "failed: {{reason}}")]),
    ("Trajectories in flight", "none", [(f"rollart_trajectories_in_flight{{{RUN}}}", "{{run}}")]),
    ("Iterations per minute", "none",
     [(f"60 * rate(rollart_iterations_total{{{RUN}}}{RATE})", "{{run}}")]),
    ("Policy version", "none", [(f"rollart_policy_version{{{RUN}}}", "{{run}}")]),
    ("Version lag of trained trajectories", "none", quantiles("rollart_version_lag", "run", RUN)),
    ("Stale token share", "percentunit", [(f"rollart_stale_token_share{{{RUN}}}", "{{run}}")]),
    ("Trained tokens per second", "none",
     [(f"rollart_trained_tokens_per_second{{{RUN}}}", "{{run}}")]),
])

ROLLOUT = ("rollout", "rollart: rollout", [
    ("Env step latency by domain", "s",
     quantiles("rollart_env_seconds", "domain", 'op="step"')),
    ("Env reset latency by domain", "s",
     quantiles("rollart_env_seconds", "domain", 'op="reset"')),
    ("Generation latency per turn by replica", "s",
     quantiles("rollart_generate_seconds", "replica")),
    ("Generated tokens per second by replica", "none",
     [(f"sum by (replica) (rate(rollart_generated_tokens_total{RATE}))", "{{replica}}")]),
    ("Prefix cache hit rate by replica", "percentunit",
     [(ratio("rollart_cached_prompt_tokens_total", "rollart_prompt_tokens_total", "replica"),
       "{{replica}}")]),
    ("Speculation acceptance by replica", "percentunit",
     [(ratio("rollart_speculation_accepted_tokens_total",
             "rollart_speculation_draft_tokens_total", "replica"), "{{replica}}")]),
    ("Reward latency by kind", "s", quantiles("rollart_reward_seconds", "kind")),
])

FLEETS = ("fleets", "rollart: fleets", [
    ("Workers up", "none", [(f'up{{job="rollart", {WORKER}}}', "{{worker}} {{exporter}}")]),
    ("CPU by worker (cores)", "none",
     [(f'rate(process_cpu_seconds_total{{exporter="rollart", {WORKER}}}{RATE})', "{{worker}}")]),
    ("Resident memory by worker", "bytes",
     [(f'process_resident_memory_bytes{{exporter="rollart", {WORKER}}}', "{{worker}}")]),
    ("Train step time", "s", quantiles("rollart_train_step_seconds", "worker")),
    ("Weight push, pull and load", "s", quantiles("rollart_weight_seconds", "op")),
    ("Temporal: activity schedule-to-start latency by task queue", "s",
     quantiles("temporal_activity_schedule_to_start_latency", "task_queue", WORKER)),
    ("Temporal: activity execution latency by type", "s",
     quantiles("temporal_activity_execution_latency", "activity_type", WORKER)),
    ("Temporal: workflow task schedule-to-start latency", "s",
     quantiles("temporal_workflow_task_schedule_to_start_latency", "worker", WORKER)),
    ("Temporal: free task slots by worker", "none",
     [(f"sum by (worker, worker_type) (temporal_worker_task_slots_available{{{WORKER}}})",
       "{{worker}} {{worker_type}}")]),
    ("Temporal: workflows in the sticky cache", "none",
     [(f"temporal_sticky_cache_size{{{WORKER}}}", "{{worker}}")]),
])


def dashboard(uid: str, title: str, panels: list) -> dict:
    source = {"type": "prometheus", "uid": "${datasource}"}
    variables = [{"name": "datasource", "label": "Prometheus", "type": "datasource",
                  "query": "prometheus"}]
    for name, query in (("run", "rollart_iterations_total"), ("worker", 'up{job="rollart"}')):
        variables.append({
            "name": name, "type": "query", "datasource": source, "refresh": 2,
            "query": {"query": f"label_values({query}, {name})", "refId": name},
            "definition": f"label_values({query}, {name})", "includeAll": True,
            "multi": True, "allValue": ".*",
            "current": {"selected": True, "text": ["All"], "value": ["$__all"]}})
    return {
        "uid": f"rollart-{uid}", "title": title, "tags": ["rollart"], "schemaVersion": 39,
        "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"}, "templating": {"list": variables},
        "panels": [{
            "id": k + 1, "type": "timeseries", "title": panel_title, "datasource": source,
            "gridPos": {"h": 8, "w": 12, "x": 12 * (k % 2), "y": 8 * (k // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + j), "datasource": source, "expr": expr,
                         "legendFormat": legend} for j, (expr, legend) in enumerate(targets)],
        } for k, (panel_title, unit, targets) in enumerate(panels)],
    }


def dashboards() -> dict[str, str]:
    """File name -> the JSON it holds."""
    return {f"{uid}.json": json.dumps(dashboard(uid, title, panels), indent=2) + "\n"
            for uid, title, panels in (TRAINING, ROLLOUT, FLEETS)}


if __name__ == "__main__":
    stale = []
    for name, text in dashboards().items():
        path = HERE / name
        if "--check" in sys.argv:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        sys.exit(f"stale dashboards (run python dashboards/build.py): {', '.join(stale)}")
