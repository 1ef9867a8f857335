"""OpenTelemetry tracing for a rollart process: the tracer provider and its exporter, and the
Temporal interceptor that carries a trace from a client through workflows into activities."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

from rollart.config import RunConfig

_LOCK = threading.Lock()


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
