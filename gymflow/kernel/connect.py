"""Connecting to Temporal and Postgres the same way everywhere (client, workers, tests)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import re
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)
from temporalio.service import TLSConfig
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_delay

from gymflow.kernel import backoff
from gymflow.kernel.config import Settings, TemporalTLSConfig
from gymflow.kernel.errors import ConfigError, GymflowError
from gymflow.kernel.logfilter import CoreLogFilter

STACK_FILE = "stack.json"
log = logging.getLogger(__name__)
# How long a starting worker or client waits for Temporal and Postgres (seconds). The config file has no
# key for it yet, so the environment sets it; every wait is bounded by it.
STARTUP_WAIT_ENV = "GYMFLOW_STARTUP_WAIT_S"
DEFAULT_STARTUP_WAIT_S = 300.0
INTERACTIVE_STARTUP_WAIT_S = 30.0  # a person at a terminal wants the fix, not five minutes of retries
TEMPORAL_FIX = "start it with `gymflow up`, or set temporal.address or $TEMPORAL_ADDRESS"


class TemporalUnreachable(GymflowError):
    """Temporal did not answer within a bound; the message says where and for how long."""


def seconds_from_env(name: str, default: float, environ: dict[str, str] | None = None) -> float:
    """A wait bound in seconds from the environment variable `name`, else `default`."""
    raw = (os.environ if environ is None else environ).get(name, "")
    try:
        return max(float(raw), 0.0) if raw.strip() else default
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: expected seconds, e.g. {default:g}") from None


def _at_terminal() -> bool:
    try:
        return bool(sys.stdin and sys.stdin.isatty() and sys.stderr and sys.stderr.isatty())
    except ValueError:  # a closed stream
        return False


def startup_wait_s(environ: dict[str, str] | None = None, *, interactive: bool | None = None) -> float:
    """The startup bound from $GYMFLOW_STARTUP_WAIT_S; unset, 300 s, or 30 s when `interactive` (default: stdin
    and stderr are terminals)."""
    interactive = _at_terminal() if interactive is None else interactive
    default = INTERACTIVE_STARTUP_WAIT_S if interactive else DEFAULT_STARTUP_WAIT_S
    return seconds_from_env(STARTUP_WAIT_ENV, default, environ)


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


CORE_LOGGER = "temporalio.core"
# Expected by design: with every step local, a workflow task lasts as long as the episode's local activities
# (the SDK extends it), so the core's "Workflow task duration exceeded 5 seconds" would be printed per episode.
_EXPECTED_CORE_WARNINGS = ("TMPRL1104",)


def worker_logging() -> LoggingConfig:
    """The SDK core's logs (WARN and up) through Python logging, as the worker's own lines are: no raw colour
    codes in a log file, without the warnings the episode shape makes expected (see above), and each other
    TMPRL code at most once a minute."""
    logger = logging.getLogger(CORE_LOGGER)
    if not any(isinstance(f, CoreLogFilter) for f in logger.filters):
        logger.addFilter(CoreLogFilter(_EXPECTED_CORE_WARNINGS))
    return LoggingConfig(filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                         forwarding=LogForwardingConfig(logger=logger))


def worker_runtime() -> Runtime:
    """The Runtime of a worker without a metrics endpoint (workers/metrics.py makes the one with)."""
    return Runtime(telemetry=TelemetryConfig(logging=worker_logging()))


def prometheus_runtime(bind: str) -> Runtime:
    """SDK metrics (task slots, schedule-to-start latency, activity failures) served at http://BIND/metrics."""
    return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=bind)))


@dataclass(frozen=True, repr=False)
class TemporalOptions:
    """How to reach Temporal besides the address: namespace, TLS, API key. Holds secrets (the key, a client
    private key): its repr is `describe()`, which names where they came from and never shows them."""

    namespace: str = "default"
    tls: bool | TLSConfig = False
    api_key: str | None = None
    rpc_metadata: Mapping[str, str] = field(default_factory=dict)
    api_key_source: str | None = None  # e.g. "$TEMPORAL_API_KEY", for messages

    def connect_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `Client.connect` (besides the address, data converter and runtime)."""
        return {"namespace": self.namespace, "tls": self.tls, "api_key": self.api_key,
                "rpc_metadata": dict(self.rpc_metadata)}

    def describe(self) -> str:
        if self.tls is False:
            how = "plaintext"
        elif isinstance(self.tls, TLSConfig) and self.tls.client_cert:
            how = "mTLS (client certificate)"
        else:
            how = "TLS"
        if isinstance(self.tls, TLSConfig) and self.tls.server_root_ca_cert:
            how += ", private CA"
        if self.api_key:
            how += f", API key from {self.api_key_source or 'config'}"
        return f"namespace {self.namespace}, {how}"

    __repr__ = describe


def _sdk_env_config(environ: Mapping[str, str]) -> dict[str, Any]:
    """Temporal's own environment configuration (TEMPORAL_NAMESPACE, TEMPORAL_API_KEY, TEMPORAL_TLS_*,
    TEMPORAL_GRPC_META_*, and the TOML profile at $TEMPORAL_CONFIG_FILE or ~/.config/temporalio/temporal.toml),
    read by the SDK itself so that its variables mean here what they mean to the `temporal` CLI."""
    try:
        from temporalio.envconfig import ClientConfig
    except ImportError:  # an SDK without envconfig: gymflow's own keys only
        return {}
    try:
        return dict(ClientConfig.load_client_connect_config(profile=environ.get("TEMPORAL_PROFILE"),
                                                            override_env_vars=dict(environ)))
    except Exception as err:  # a malformed TOML profile or an unreadable TEMPORAL_TLS_* file
        raise ConfigError(f"Temporal environment configuration (TEMPORAL_* variables, temporal.toml): "
                          f"{_first_line(err)}; or set temporal.env_config: false") from None


def _read_pem(path: Path | None, key: str) -> bytes | None:
    if path is None:
        return None
    try:
        return path.expanduser().read_bytes()
    except OSError as err:
        raise ConfigError(f"temporal.tls.{key}: cannot read {path}: {err.strerror or err}") from None


def _tls_from_files(tls: TemporalTLSConfig) -> bool | TLSConfig:
    if not tls.enabled:
        return False
    return TLSConfig(server_root_ca_cert=_read_pem(tls.ca_cert, "ca_cert"), domain=tls.server_name,
                     client_cert=_read_pem(tls.client_cert, "client_cert"),
                     client_private_key=_read_pem(tls.client_key, "client_key"))


def temporal_options(settings: Settings, environ: Mapping[str, str] | None = None) -> TemporalOptions:
    """Namespace, TLS and API key from the config's `temporal` section; what it leaves unset comes from
    Temporal's environment configuration (unless `temporal.env_config: false`). The API key is read from
    the variable that `temporal.api_key_env` names, so it is never in a config file."""
    cfg = settings.temporal
    env = os.environ if environ is None else environ
    sdk = _sdk_env_config(env) if cfg.env_config else {}
    namespace = cfg.namespace if "namespace" in cfg.model_fields_set else sdk.get("namespace", cfg.namespace)
    api_key, source = None, None
    if cfg.api_key_env:
        api_key = env.get(cfg.api_key_env, "").strip()
        if not api_key:
            raise ConfigError(f"temporal.api_key_env: environment variable ${cfg.api_key_env} is not set or empty")
        source = f"${cfg.api_key_env}"
    elif sdk.get("api_key"):
        api_key, source = sdk["api_key"], "Temporal env config ($TEMPORAL_API_KEY or profile)"
    if cfg.tls is not None:
        tls: bool | TLSConfig = _tls_from_files(cfg.tls)
    elif "tls" in sdk:
        tls = sdk["tls"]
    else:
        tls = api_key is not None  # as the SDK does: an API key (Temporal Cloud) implies TLS, system roots
    return TemporalOptions(namespace=namespace, tls=tls, api_key=api_key, api_key_source=source,
                           rpc_metadata=sdk.get("rpc_metadata") or {})


# Connect errors that waiting does not cure: a certificate or key the server (or we) refuse, bad credentials.
_FATAL_MARKERS = ("certificate", "alert", "unknownissuer", "unauthenticated", "permission denied",
                  "permissiondenied", "api key")


def _is_fatal(err: BaseException) -> bool:
    text = str(err).lower()
    return any(m in text for m in _FATAL_MARKERS)


async def connect_configured(settings: Settings, *, wait_s: float = 30.0, runtime: Runtime | None = None,
                             on_wait: Callable[[str], None] | None = None) -> Client:
    """The one front door for workers, the client and the CLI: address from config/env/`gymflow up`,
    namespace/TLS/API key from `temporal_options`."""
    address, _ = resolve_addresses(settings)
    return await connect_temporal(address, wait_s=wait_s, runtime=runtime, on_wait=on_wait,
                                  options=temporal_options(settings))


async def connect_temporal(address: str, namespace: str = "default", wait_s: float = 30.0,
                           runtime: Runtime | None = None, on_wait: Callable[[str], None] | None = None,
                           *, options: TemporalOptions | None = None) -> Client:
    """Connect, retrying for up to `wait_s`: the server may not be up yet, or accept TCP before gRPC.
    Each retry after the first few seconds is announced through `on_wait` (default: a log warning).
    `options` (TLS, API key, its namespace) replace `namespace`; a TLS or auth refusal is not retried."""
    opts = options or TemporalOptions(namespace=namespace)
    notify = on_wait or log.warning
    last_note = -float("inf")

    def announce(rs: RetryCallState) -> None:
        nonlocal last_note
        waited = rs.seconds_since_start
        if waited >= 2.0 and waited - last_note >= 5.0:  # a server that is just starting is not news
            # The first notice says how to fix it: the last one comes only when the wait ends.
            fix = f" for up to {wait_s:.0f} s; {TEMPORAL_FIX}" if last_note < 0 else ""
            notify(f"Temporal at {address} unreachable, retrying (since {waited:.0f} s){fix}")
            last_note = waited

    async def attempt() -> Client:
        try:
            return await Client.connect(address, data_converter=pydantic_data_converter, runtime=runtime,
                                        **opts.connect_kwargs())
        except RuntimeError as err:
            if _is_fatal(err) or not isinstance(opts.tls, TLSConfig):
                raise
            # Under TLS 1.3 the server's refusal of a missing client certificate comes after the handshake, and
            # under load the SDK may report only the closed transport: ask the server directly, once per attempt,
            # so a refusal fails now instead of being retried until the wait ends.
            refusal = await asyncio.to_thread(tls_refusal, address, opts.tls)
            if refusal:
                raise RuntimeError(f"{err} ({refusal})") from None
            raise

    started = time.monotonic()
    try:
        return await AsyncRetrying(
            # the SDK's "Failed client connect: ..."; a TLS or auth refusal is not retried
            retry=retry_if_exception(lambda e: isinstance(e, RuntimeError) and not _is_fatal(e)),
            stop=stop_after_delay(wait_s), before_sleep=announce, reraise=True, wait=backoff.until(wait_s),
        )(attempt)
    except RuntimeError as err:
        if _is_fatal(err):
            raise TemporalUnreachable(
                f"Temporal at {address} refused the connection ({opts.describe()}): {_gist(err)}; "
                "check temporal.tls (ca_cert, client_cert/client_key, server_name) and temporal.api_key_env"
            ) from None
        hint = "; if it expects TLS, set temporal.tls" if opts.tls is False else ""
        raise TemporalUnreachable(f"Temporal at {address} unreachable for {time.monotonic() - started:.0f} s, gave up "
                                  f"({_first_line(err)}); {TEMPORAL_FIX}{hint}") from None


TLS_PROBE_TIMEOUT_S = 3.0


def tls_refusal(address: str, tls: TLSConfig, timeout_s: float = TLS_PROBE_TIMEOUT_S) -> str | None:
    """Whether the server at `address` refuses this TLS configuration, in rustls' words (`received fatal alert:
    CertificateRequired`, `InvalidCertificate(UnknownIssuer)`); None when it accepts it or cannot be reached (a
    server not up yet is waited for, not refused). A handshake plus one read, bounded by `timeout_s`."""
    host, _, port = address.rpartition(":")
    ctx = ssl.create_default_context(cadata=tls.server_root_ca_cert.decode() if tls.server_root_ca_cert else None)
    ctx.set_alpn_protocols(["h2"])
    with tempfile.TemporaryDirectory() as tmp:
        if tls.client_cert and tls.client_private_key:
            cert, key = Path(tmp, "cert.pem"), Path(tmp, "key.pem")
            for path, data in ((cert, tls.client_cert), (key, tls.client_private_key)):
                path.touch(mode=0o600)
                path.write_bytes(data)
            ctx.load_cert_chain(cert, key)
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as raw, \
                    ctx.wrap_socket(raw, server_hostname=tls.domain or host.strip("[]")) as conn:
                # Read only: a refusing server sends its alert and closes; bytes of ours arriving after that
                # would draw a reset that can discard the alert. An accepting gRPC server sends its HTTP/2
                # settings unasked (or nothing: the read times out, no refusal).
                conn.recv(1)
        except ssl.SSLCertVerificationError as e:
            why = str(e.verify_message).lower()
            reason = "UnknownIssuer" if "issuer" in why or "self-signed" in why or "self signed" in why \
                else "BadCertificate"
            return f"InvalidCertificate({reason}): {e.verify_message}"
        except ssl.SSLError as e:
            text = str(e).lower()
            if "certificate required" in text or "certificate_required" in text:
                return "received fatal alert: CertificateRequired"
            if "unknown ca" in text or "bad certificate" in text or "certificate unknown" in text:
                return f"received fatal alert: BadCertificate ({e.reason})"
            return None
        except (OSError, ValueError):
            return None
    return None


_GIST = re.compile(r"received fatal alert: \w+|InvalidCertificate\(\w+\)|Unauthenticated[^,}]*|PermissionDenied[^,}]*")


def _gist(err: BaseException) -> str:
    """The telling part of a TLS/auth refusal (e.g. `received fatal alert: CertificateRequired`), not the
    whole nested Rust error."""
    found = _GIST.search(str(err))
    return found.group(0) if found else _first_line(err)


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]
