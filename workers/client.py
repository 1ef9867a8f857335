"""Connecting to Temporal with what every rollart process shares: the pydantic converter, the
optional payload encryption codec, TLS / mTLS and an API key for remote clusters."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import TLSConfig

from rollart.config import TemporalConfig
from rollart.workers.codec import codec_from_env


def client_options(config: TemporalConfig) -> dict[str, Any]:
    """Client.connect's keyword arguments for this config (secrets read from the environment)."""
    api_key = None
    if config.api_key_env:
        api_key = os.environ.get(config.api_key_env)
        if not api_key:
            raise ValueError(f"temporal.api_key_env: the environment variable "
                             f"{config.api_key_env} holding the API key is not set")
    tls: bool | TLSConfig = bool(config.tls or api_key)
    if bool(config.tls_cert_path) != bool(config.tls_key_path):
        raise ValueError("temporal: mTLS needs both tls_cert_path and tls_key_path")
    if config.tls_ca_path or config.tls_cert_path or config.tls_server_name:
        tls = TLSConfig(
            server_root_ca_cert=_read(config.tls_ca_path),
            client_cert=_read(config.tls_cert_path),
            client_private_key=_read(config.tls_key_path),
            domain=config.tls_server_name)
    codec = codec_from_env(config.encryption_key_env)
    converter = (dataclasses.replace(pydantic_data_converter, payload_codec=codec)
                 if codec is not None else pydantic_data_converter)
    return {"namespace": config.namespace, "data_converter": converter, "tls": tls,
            "api_key": api_key}


def _read(path: str | None) -> bytes | None:
    return Path(path).expanduser().read_bytes() if path else None


async def connect(config: TemporalConfig, interceptors: list | None = None,
                  runtime: Runtime | None = None) -> Client:
    """`interceptors`: e.g. tracing, and `runtime`: one exporting the SDK's metrics (both from
    rollart.workers.telemetry), for the workers that use this client too."""
    options = client_options(config)
    if runtime is not None:
        options["runtime"] = runtime
    try:
        return await Client.connect(config.address, interceptors=interceptors or [], **options)
    except RuntimeError as err:
        raise ConnectionError(
            f"temporal.address: cannot reach a Temporal server at {config.address} ({err})"
        ) from err
