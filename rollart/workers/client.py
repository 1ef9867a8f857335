"""Connecting to Temporal with the converter every rollart process shares."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from rollart.config import TemporalConfig


async def connect(config: TemporalConfig) -> Client:
    try:
        return await Client.connect(config.address, namespace=config.namespace,
                                    data_converter=pydantic_data_converter)
    except RuntimeError as err:
        raise ConnectionError(
            f"temporal.address: cannot reach a Temporal server at {config.address} ({err})"
        ) from err
