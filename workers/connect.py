"""Connecting to Temporal and Postgres the same way everywhere (client, workers, tests)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from gymflow.kernel.config import Settings
from gymflow.kernel.errors import ConfigError

STACK_FILE = "stack.json"


def stack_file(settings: Settings) -> Path:
    return Path(settings.state_dir) / STACK_FILE


def resolve_addresses(settings: Settings) -> tuple[str, str]:
    """(temporal address, database url): from config/env, else from a running `gymflow up`."""
    temporal, database = settings.temporal.address, settings.database.url
    if temporal and database:
        return temporal, database
    path = stack_file(settings)
    if path.exists():
        stack = json.loads(path.read_text())
        return temporal or stack["temporal_address"], database or stack["database_url"]
    missing = " and ".join(n for n, v in (("TEMPORAL_ADDRESS", temporal), ("DATABASE_URL", database)) if not v)
    raise ConfigError(f"no running stack: set {missing}, or start the embedded one with `gymflow up` "
                      f"(it writes {path})")


def prometheus_runtime(bind: str) -> Runtime:
    """SDK metrics (task slots, schedule-to-start latency, activity failures) served at http://BIND/metrics."""
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))


async def connect_temporal(address: str, namespace: str = "default", wait_s: float = 30.0,
                           runtime: Runtime | None = None) -> Client:
    """Connect, retrying for up to `wait_s`: a server that was just started may accept TCP before gRPC."""
    deadline = asyncio.get_running_loop().time() + wait_s
    while True:
        try:
            return await Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter,
                                        runtime=runtime)
        except RuntimeError:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            await asyncio.sleep(0.5)
