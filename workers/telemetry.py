"""OpenTelemetry for a rollart process: the tracer provider and its exporter, the Temporal
interceptor that carries a trace from a client through workflows into activities, and the
Prometheus endpoints that serve its metrics (rollart's and the Temporal SDK's)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

from rollart.config import RunConfig
from rollart.servers import free_port

_LOCK = threading.Lock()
_SERVING: dict[str, object] = {}  # this process's endpoints, started once
SCRAPE_CONFIG = """\
# Written by rollart: scrapes every worker of the run that announced itself under targets/.
# prometheus --config.file=<this file> --web.listen-address=127.0.0.1:9090
global:
  scrape_interval: {interval}
scrape_configs:
  - job_name: rollart
    file_sd_configs:
      - files: ["targets/*.json"]
        refresh_interval: 1s
"""


def start_tracing(config: RunConfig, service: str) -> Callable[[], None]:
    """Export this process's spans as `config.telemetry` says; returns the flush-and-stop.
    The process's tracer provider is set once; a later call (a test's second fleet) adds its
    exporter to it."""
    telemetry = config.telemetry
    if telemetry.traces == "off":
        return lambda: None
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    if telemetry.traces == "otlp":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=telemetry.otlp_endpoint or os.environ.get(
            "OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4317"))
        closing = None
    elif telemetry.traces == "console":
        exporter, closing = ConsoleSpanExporter(), None
    else:
        path = Path(telemetry.traces_file or Path(config.run_dir) / "traces.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        closing = path.open("a", buffering=1)  # whole lines: processes append to one file
        exporter = ConsoleSpanExporter(out=closing, formatter=lambda span: span.to_json(
            indent=None) + "\n")
    with _LOCK:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(resource=Resource.create({"service.name": service}))
            trace.set_tracer_provider(provider)
    processor = BatchSpanProcessor(exporter)
    provider.add_span_processor(processor)

    def stop() -> None:
        processor.shutdown()
        if closing is not None:
            closing.close()

    return stop


def temporal_interceptors(config: RunConfig) -> list:
    """The client's interceptors: tracing when traces are on."""
    if config.telemetry.traces == "off":
        return []
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return [TracingInterceptor()]


def start_metrics(config: RunConfig, worker: str, role: str):
    """Serve this process's metrics as `config.telemetry` says: rollart's instruments
    (rollart.metrics) through an OpenTelemetry meter provider on one Prometheus endpoint, the
    Temporal SDK's from a temporalio Runtime on another. Returns that Runtime, for the client
    to connect with (None when metrics are off), and announces both endpoints in
    <run_dir>/metrics/targets/<worker>.json, labelled with the worker and its role."""
    telemetry = config.telemetry
    if telemetry.metrics == "off":
        return None
    with _LOCK:
        if "runtime" not in _SERVING:
            _SERVING.update(_serve(telemetry.metrics_host, telemetry.metrics_port, worker))
    ports = _SERVING["ports"]
    directory = Path(config.run_dir) / "metrics"
    labels = {"worker": worker, "role": role}
    _write(directory / "targets" / f"{worker}.json", [
        {"targets": [f"{telemetry.metrics_host}:{port}"], "labels": {**labels, "exporter": name}}
        for name, port in zip(("rollart", "temporal"), ports, strict=True)])
    scrape = directory / "prometheus.yml"
    if not scrape.exists():
        _write(scrape, SCRAPE_CONFIG.format(interval="5s"))
    return _SERVING["runtime"]


def stop_metrics(config: RunConfig, worker: str) -> None:
    """Withdraw this worker's announcement (the endpoints go with the process)."""
    if config.telemetry.metrics != "off":
        with contextlib.suppress(FileNotFoundError):
            (Path(config.run_dir) / "metrics" / "targets" / f"{worker}.json").unlink()


def _serve(host: str, port: int, worker: str) -> dict[str, object]:
    from opentelemetry import metrics
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.resources import Resource
    from prometheus_client import start_http_server
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    metrics.set_meter_provider(MeterProvider(
        metric_readers=[PrometheusMetricReader()],
        resource=Resource.create({"service.name": f"rollart-{worker}"})))
    server, _ = start_http_server(port, addr=host)
    sdk_port = port + 1 if port else free_port(host)
    runtime = Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(
        bind_address=f"{host}:{sdk_port}", durations_as_seconds=True)))
    return {"runtime": runtime, "ports": (server.server_port, sdk_port)}


def _write(path: Path, content: object) -> None:
    """Whole or not at all: Prometheus rereads these files while they change."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}")
    staging.write_text(content if isinstance(content, str) else json.dumps(content))
    staging.replace(path)
