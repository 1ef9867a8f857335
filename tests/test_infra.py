"""The deployment in infra/: every Kubernetes manifest validates against the Kubernetes API
schema (offline, strict), the fleet it declares is the one its run config declares, and the
Temporal Helm values keep what rollart's fan-out needs."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import yaml
from kubernetes_validate import ValidationError, validate

from rollart.config import RunConfig

INFRA = Path(__file__).parents[1] / "infra"
KUBERNETES = "1.30.0"


def manifests() -> list[dict]:
    return [doc for path in sorted((INFRA / "k8s").glob("*.yaml"))
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def by_kind(kind: str) -> list[dict]:
    return [doc for doc in manifests() if doc["kind"] == kind]


def run_config() -> RunConfig:
    config_map = next(doc for doc in by_kind("ConfigMap")
                      if doc["metadata"]["name"] == "rollart-config")
    return RunConfig.model_validate(tomllib.loads(config_map["data"]["run.toml"]))


def workers() -> list[tuple[dict, list[str]]]:
    """(workload, its `rollart worker` command) for every rollart worker."""
    found = []
    for doc in by_kind("Deployment") + by_kind("StatefulSet"):
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container.get("command", [])[:2] == ["rollart", "worker"]:
                found.append((doc, container["command"]))
    return found


@pytest.mark.parametrize("doc", manifests(), ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")
def test_every_manifest_validates_against_the_kubernetes_schema(doc):
    validate(doc, KUBERNETES, strict=True)


def test_the_validation_rejects_a_broken_manifest():
    broken = yaml.safe_load((INFRA / "k8s" / "10-control.yaml").read_text())
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = "Sometimes"
    broken["spec"]["replica"] = 2
    with pytest.raises(ValidationError):
        validate(broken, KUBERNETES, strict=True)


def test_the_fleet_matches_its_run_config():
    config = run_config()
    served = {}
    for doc, command in workers():
        args = dict(zip(command[2::2], command[3::2], strict=False))
        role, pool = args["--role"], args.get("--pool")
        served[(role, pool)] = doc
        if role == "control":
            continue
        spec = config.pool(role, pool)  # raises when the config has no such pool
        if role == "gen":
            assert doc["kind"] == "StatefulSet" and doc["spec"]["replicas"] == spec.replicas
            assert args["--replica"] == "$(POD_INDEX)"
        pod = doc["spec"]["template"]["spec"]
        if spec.hardware != "cpu":  # a GPU pool: on its GPU type, with GPUs requested
            assert pod["nodeSelector"]["nvidia.com/gpu.product"].endswith(spec.hardware.upper())
            gpus = int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            assert gpus >= 1
            if role == "gen":  # one GPU per tensor-parallel rank
                assert gpus == spec.tensor_parallel_size
            if role == "train":  # one GPU per data-parallel rank
                assert config.trainer.device == "cuda" and gpus == config.trainer.ranks
    declared = {("control", None)} | {(p.role, p.name) for p in config.pools}
    assert set(served) == declared
    for doc, _ in workers():
        container = doc["spec"]["template"]["spec"]["containers"][0]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named == {"rollart-metrics": config.telemetry.metrics_port,
                         "sdk-metrics": config.telemetry.metrics_port + 1}
    assert config.telemetry.metrics == "prometheus" and config.telemetry.metrics_host == "0.0.0.0"
    services = {doc["metadata"]["name"] for doc in by_kind("Service")}
    assert config.weights.mooncake_master.split(".")[0] in services
    assert config.telemetry.otlp_endpoint.split(".")[0] in services


def test_the_prometheus_config_gives_the_labels_the_dashboards_use():
    """(Debian's promtool cannot check it: its build leaves Kubernetes discovery out.)"""
    config_map = next(doc for doc in by_kind("ConfigMap")
                      if doc["metadata"]["name"] == "rollart-prometheus")
    job = yaml.safe_load(config_map["data"]["prometheus.yml"])["scrape_configs"][0]
    assert job["job_name"] == "rollart"  # the dashboards select job="rollart"
    targets = {rule.get("target_label") for rule in job["relabel_configs"]}
    assert {"worker", "role", "exporter"} <= targets
    kept = next(r for r in job["relabel_configs"] if r.get("action") == "keep")["regex"]
    ports = {p["name"] for doc, _ in workers()
             for p in doc["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert set(kept.split("|")) == ports


def test_the_temporal_values_size_the_cluster_for_the_fan_out():
    values = yaml.safe_load((INFRA / "temporal" / "values.yaml").read_text())
    server = values["server"]
    shards = server["config"]["numHistoryShards"]
    assert shards >= 512 and shards & (shards - 1) == 0  # a power of two
    for store in ("default", "visibility"):
        persistence = server["config"]["persistence"][store]
        assert persistence["driver"] == "sql" and persistence["sql"]["driver"] == "postgres12"
    for dependency in ("cassandra", "mysql", "elasticsearch"):
        assert values[dependency]["enabled"] is False
    dynamic = server["dynamicConfig"]
    assert all(isinstance(v, list) and all("value" in c for c in v) for v in dynamic.values())
    config = run_config()
    in_flight = 2 * config.algorithm.batch_size * (1 + config.algorithm.redundancy
                                                   / config.algorithm.group_size)
    assert dynamic["limit.numPendingChildExecutions.error"][0]["value"] >= 2 * in_flight
    control = dynamic["matching.numTaskqueueReadPartitions"][0]["constraints"]
    assert control["taskQueueName"] == config.temporal.control_queue
