"""One Prometheus endpoint per worker: gymflow's rollout metrics (activities/metrics.py) with the SDK's own.

The SDK's Rust exporter listens on a private 127.0.0.1 port and each scrape of `--metrics HOST:PORT` folds its
families into prometheus_client's registry, so an operator scrapes one endpoint per worker. The endpoint has no
authentication: `:PORT` (no host) means loopback, and only an address the operator names is reachable from
other machines.
"""

from __future__ import annotations

import logging
import socket
import urllib.request
from collections.abc import Iterator

import gymflow.activities.metrics  # noqa: F401 - registers gymflow's rollout metrics in the served registry
from prometheus_client import REGISTRY, start_http_server
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from gymflow.http_service import listen_host
from gymflow.kernel.connect import worker_logging
from gymflow.kernel.errors import ConfigError

log = logging.getLogger(__name__)

# ---- serving --------------------------------------------------------------------------------------------


class SdkMetrics(Collector):
    """The SDK exporter's families, fetched at each scrape; a failed fetch leaves only gymflow's own."""

    def __init__(self, url: str) -> None:
        self.url = url

    def describe(self) -> list[Metric]:
        return []  # names are only known at scrape time; this also keeps register() from fetching

    def collect(self) -> Iterator[Metric]:
        try:
            with urllib.request.urlopen(self.url, timeout=5) as resp:  # noqa: S310 - our own loopback URL
                text = resp.read().decode()
        except OSError as err:
            log.warning("SDK metrics at %s unreadable: %s", self.url, err)
            return
        yield from text_string_to_metric_families(text)


def split_bind(bind: str) -> tuple[str, int]:
    """(host, port) of `HOST:PORT`, `[IPv6]:PORT` or `:PORT`; an empty host is loopback, never every interface."""
    host, sep, port = bind.strip().rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"--metrics {bind!r}: expected HOST:PORT, e.g. 127.0.0.1:9464 (0.0.0.0:9464 to serve "
                          "every interface)")
    return listen_host(host), int(port)


def start_server(bind: str) -> None:
    """Serve this process's registry at http://BIND/metrics (a daemon thread)."""
    host, port = split_bind(bind)
    try:
        start_http_server(port, addr=host)
    except OSError as err:
        raise ConfigError(f"--metrics {bind}: cannot listen ({err.strerror or err})") from None


def _loopback_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(bind: str) -> Runtime:
    """Serve rollout and SDK metrics at http://BIND/metrics; returns the Runtime the worker's client must use.
    The SDK's counters end in one `_total` and its durations are seconds, as Prometheus conventions ask.

    The `_total` is not the exporter's `counters_total_suffix`: that appends it to every counter, so those
    the SDK already names `..._total` (`temporal_local_activity_total`) came out `..._total_total`. The SDK
    exports its own names, and prometheus_client's parser (SdkMetrics) gives each counter family the
    OpenMetrics form, whose samples end in exactly one `_total`: `temporal_request` is served as
    `temporal_request_total`, `temporal_local_activity_total` as itself (tests/test_metrics.py checks both)."""
    start_server(bind)
    sdk_bind = f"127.0.0.1:{_loopback_port()}"
    runtime = Runtime(telemetry=TelemetryConfig(logging=worker_logging(), metrics=PrometheusConfig(
        bind_address=sdk_bind, counters_total_suffix=False, durations_as_seconds=True)))
    REGISTRY.register(SdkMetrics(f"http://{sdk_bind}/metrics"))
    return runtime
