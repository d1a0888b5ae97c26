"""Connecting to Temporal and Postgres the same way everywhere (client, workers, tests)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import LoggingConfig, PrometheusConfig, Runtime, TelemetryConfig, TelemetryFilter

from gymflow.kernel.config import Settings
from gymflow.kernel.errors import ConfigError, GymflowError

STACK_FILE = "stack.json"
log = logging.getLogger(__name__)
# How long a starting worker or client waits for Temporal and Postgres (seconds). The config file has no
# key for it yet, so the environment sets it; every wait is bounded by it.
STARTUP_WAIT_ENV = "GYMFLOW_STARTUP_WAIT_S"
DEFAULT_STARTUP_WAIT_S = 300.0


class TemporalUnreachable(GymflowError):
    """Temporal did not answer within a bound; the message says where and for how long."""


def seconds_from_env(name: str, default: float, environ: dict[str, str] | None = None) -> float:
    """A wait bound in seconds from the environment variable `name`, else `default`."""
    raw = (os.environ if environ is None else environ).get(name, "")
    try:
        return max(float(raw), 0.0) if raw.strip() else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected seconds, e.g. {default:g}") from None


def startup_wait_s(environ: dict[str, str] | None = None) -> float:
    """The startup bound from $GYMFLOW_STARTUP_WAIT_S (default 300 s)."""
    return seconds_from_env(STARTUP_WAIT_ENV, DEFAULT_STARTUP_WAIT_S, environ)


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


@functools.cache
def quiet_runtime() -> Runtime:
    """For the CLI and client: the SDK core logs a WARN line per retried call (hundreds during a Temporal
    restart) straight to the terminal. We report outages ourselves, once, so its logs stop at ERROR."""
    return Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(
        filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))))


def prometheus_runtime(bind: str) -> Runtime:
    """SDK metrics (task slots, schedule-to-start latency, activity failures) served at http://BIND/metrics."""
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))


async def connect_temporal(address: str, namespace: str = "default", wait_s: float = 30.0,
                           runtime: Runtime | None = None, on_wait: Callable[[str], None] | None = None) -> Client:
    """Connect, retrying for up to `wait_s`: the server may not be up yet, or accept TCP before gRPC.
    Each retry after the first few seconds is announced through `on_wait` (default: a log warning)."""
    notify = on_wait or log.warning
    started = time.monotonic()
    delay, last_note = 0.5, -float("inf")
    while True:
        try:
            return await Client.connect(address, namespace=namespace, data_converter=pydantic_data_converter,
                                        runtime=runtime)
        except RuntimeError as err:  # the SDK's "Failed client connect: ..."
            waited = time.monotonic() - started
            if waited >= wait_s:
                raise TemporalUnreachable(f"Temporal at {address} unreachable for {waited:.0f} s, gave up "
                                          f"({_first_line(err)}); start it or fix TEMPORAL_ADDRESS") from None
            if waited >= 2.0 and waited - last_note >= 5.0:  # a server that is just starting is not news
                notify(f"Temporal at {address} unreachable, retrying (since {waited:.0f} s)")
                last_note = waited
            await asyncio.sleep(min(delay, max(wait_s - waited, 0.05)))
            delay = min(delay * 2, 5.0)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
