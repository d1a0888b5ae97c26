"""HTTP to one NeMo Gym resources server: where it is, one bounded POST, and what counts as transient.

The servers are FastAPI apps (`nemo_gym.base_resources_server.SimpleResourcesServer`); a session is a signed
cookie set by `/seed_session` and sent back on every later call (docs/environments.md, "NeMo Gym adapter").
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

from gymflow.kernel.errors import ConfigError

T = TypeVar("T")

SERVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
DEFAULT_TIMEOUT_S = 30.0  # one call; the env activity's start-to-close (120 s) bounds the whole step
TIMEOUT_ENV = "GYMFLOW_NEMO_GYM_TIMEOUT_S"
MAX_REPLY_BYTES = 8 * 1024 * 1024  # a verify reply echoes the request (the whole episode)
MAX_COOKIE_BYTES = 8 * 1024  # cookies travel in workflow history with every tool call
_COOKIE_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}")
_COOKIE_VALUE = re.compile(r"[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]{0,4096}")  # RFC 6265 cookie-octet
_TRANSIENT_STATUS = {408, 425, 429}


class ServerUnavailable(Exception):
    """The server could not be reached or answered 408/429/5xx. Not the model's fault: for a tool call the
    activity retries it (bounded) and then fails the rollout as `environment_error`; verify masks it."""


@dataclass
class Reply:
    status: int
    text: str
    cookies: dict[str, str] = field(default_factory=dict)

    def snippet(self, limit: int = 300) -> str:
        one_line = " ".join(self.text.split())
        return one_line if len(one_line) <= limit else one_line[:limit] + "..."


def url_env_var(server: str) -> str:
    return "GYMFLOW_NEMO_GYM_" + re.sub(r"[^A-Z0-9]", "_", server.upper()) + "_URL"


def redact(url: str) -> str:
    """The URL without credentials or query, fit for a message or a log."""
    try:
        parsed = httpx.URL(url)
        return str(parsed.copy_with(username=None, password=None, query=None, fragment=None))
    except (httpx.InvalidURL, TypeError, ValueError):
        return "<unparsable URL>"


def server_url(server: str, options: Mapping[str, Any] | None = None) -> str:
    """`options["servers"][server]` (the run's config, reaches verify only), else $GYMFLOW_NEMO_GYM_<SERVER>_URL."""
    var = url_env_var(server)
    servers = (options or {}).get("servers")
    if servers is not None and not isinstance(servers, Mapping):
        raise ConfigError("environments.nemo_gym.servers: expected a mapping of server name to URL")
    url = (servers or {}).get(server) or os.environ.get(var)
    where = f"environments.nemo_gym.servers.{server}" if (servers or {}).get(server) else var
    if not url:
        raise ConfigError(f"no URL for NeMo Gym resources server {server!r}: set {var} on the env workers")
    if not isinstance(url, str):
        raise ConfigError(f"{where}: expected a URL string")
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, TypeError, ValueError):
        raise ConfigError(f"{where}: not a URL") from None
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise ConfigError(f"{where}: expected http(s)://host[:port], got {redact(url)}")
    return url.rstrip("/")


def timeout_s(options: Mapping[str, Any] | None = None) -> float:
    raw = (options or {}).get("timeout_s") or os.environ.get(TIMEOUT_ENV) or DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise ConfigError(f"{TIMEOUT_ENV} / environments.nemo_gym.timeout_s: expected seconds, got {raw!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{TIMEOUT_ENV} / environments.nemo_gym.timeout_s: expected a positive number")
    return value


def encode(body: Any) -> bytes:
    """Strict JSON: NaN/Infinity and lone surrogates would be rejected (or mangled) by the server."""
    return json.dumps(body, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def _cookie_header(cookies: Mapping[str, str]) -> dict[str, str]:
    return {"Cookie": "; ".join(f"{k}={v}" for k, v in cookies.items())} if cookies else {}


def _reply_cookies(resp: httpx.Response) -> dict[str, str]:
    out = {}
    for cookie in resp.cookies.jar:
        if cookie.value is not None and _COOKIE_NAME.fullmatch(cookie.name) and _COOKIE_VALUE.fullmatch(cookie.value):
            out[cookie.name] = cookie.value
    return out


def merge_cookies(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, str]:
    merged = {**old, **new}
    if sum(len(k) + len(v) for k, v in merged.items()) > MAX_COOKIE_BYTES:
        raise ServerUnavailable(f"the server set over {MAX_COOKIE_BYTES} bytes of cookies; refusing to carry them")
    return merged


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS context, built once per process: building it (reading the CA bundle) costs ~18 ms of CPU,
    which a fresh client per request paid on every seed, tool call and verify (bench/nemo_gym_side_by_side.py
    --via-adapter). The client itself stays per request, so no cookie jar or connection is shared between
    episodes."""
    return httpx.create_ssl_context()


async def post(base_url: str, path: str, body: bytes, cookies: Mapping[str, str], timeout: float, *,
               answered: frozenset[int] = frozenset(), headers: Mapping[str, str] | None = None) -> Reply:
    """One POST, bounded in time (connect, each read, and the whole exchange) and in reply size. A 5xx or 408/429
    raises ServerUnavailable unless its status is in `answered` (a tool route's 500 is the model's to see)."""
    where = f"{redact(base_url)}{path}"
    headers = {**(headers or {}), "Content-Type": "application/json", **_cookie_header(cookies)}
    try:
        async with asyncio.timeout(timeout):
            # trust_env=False: a proxy from the worker's environment must not sit between us and a local server.
            async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=min(10.0, timeout)),
                                         follow_redirects=False, trust_env=False, verify=tls_context()) as client:
                async with client.stream("POST", base_url + path, content=body, headers=headers) as resp:
                    chunks, size = [], 0
                    async for chunk in resp.aiter_bytes():
                        size += len(chunk)
                        if size > MAX_REPLY_BYTES:
                            raise ServerUnavailable(f"{where}: reply over {MAX_REPLY_BYTES:,} bytes")
                        chunks.append(chunk)
                    reply = Reply(resp.status_code, b"".join(chunks).decode("utf-8", "replace"), _reply_cookies(resp))
    except TimeoutError:
        raise ServerUnavailable(f"{where}: no reply within {timeout:g} s") from None
    except httpx.HTTPError as e:
        raise ServerUnavailable(f"{where}: {type(e).__name__}: {str(e)[:200] or 'connection failed'}") from None
    if (reply.status >= 500 or reply.status in _TRANSIENT_STATUS) and reply.status not in answered:
        raise ServerUnavailable(f"{where}: HTTP {reply.status}: {reply.snippet()}")
    return reply


async def with_retries(call: Callable[[], Awaitable[T]], *, attempts: int = 3, backoff_s: float = 1.0) -> T:
    """`call` until it does not raise ServerUnavailable, at most `attempts` times (backoff doubles)."""
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except ServerUnavailable:
            if attempt == attempts:
                raise
            await asyncio.sleep(backoff_s * 2 ** (attempt - 1))
    raise AssertionError("unreachable")
