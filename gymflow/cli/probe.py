"""Probe each configured model endpoint once (GET {base_url}/models) and say what is wrong in one line: refused,
DNS, TLS, timeout, a rejected key, or a model the endpoint does not serve. Run by `collect` (a failure stops it
before any rollout starts) and `up` / `worker` (a warning: the endpoint may come up later)."""

from __future__ import annotations

import asyncio
import os
import ssl
from collections.abc import Iterable

import httpx

from gymflow.kernel.config import ModelConfig, Settings

PROBE_TIMEOUT_S = 5.0


def shown_url(base_url: str) -> str:
    """The URL without credentials or query (a key can hide in either)."""
    try:
        u = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return "<unparsable URL>"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}"


def _cause(exc: BaseException) -> BaseException:
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return exc


def _connect_problem(url: str, host: str, exc: httpx.TransportError) -> str:
    root = _cause(exc)
    text = f"{exc} {root}".lower()
    if isinstance(root, ssl.SSLError) or "ssl" in text or "certificate" in text:
        return f"TLS error at {url}: {str(root)[:160]}"
    if "name or service not known" in text or "nodename nor servname" in text or "name resolution" in text \
            or "getaddrinfo" in text:
        return f"DNS lookup failed for {host}"
    if isinstance(root, ConnectionRefusedError) or "refused" in text:
        return f"connection refused at {url}"
    return f"cannot connect to {url}: {str(root)[:160] or type(root).__name__}"


async def probe_model(name: str, cfg: ModelConfig, timeout_s: float = PROBE_TIMEOUT_S) -> str | None:
    """None when the endpoint answers and serves `cfg.model` (or does not list models); else one line."""
    if cfg.base_url is None or cfg.recorded:
        return None  # replayed: no endpoint
    url = shown_url(cfg.base_url)
    headers = {}
    if cfg.api_key_env and (key := os.environ.get(cfg.api_key_env)):
        headers["Authorization"] = f"Bearer {key}"
    try:
        async with httpx.AsyncClient(timeout=timeout_s, follow_redirects=False) as client:
            resp = await client.get(cfg.base_url.rstrip("/") + "/models", headers=headers)
    except httpx.TimeoutException:
        return f"model {name!r}: timed out after {timeout_s:g} s at {url}"
    except httpx.TransportError as e:
        return f"model {name!r}: {_connect_problem(url, httpx.URL(cfg.base_url).host, e)}"
    if resp.status_code in (401, 403):
        hint = f"check the key in ${cfg.api_key_env}" if cfg.api_key_env else "no api_key_env is configured"
        return f"model {name!r}: {resp.status_code} from {url} ({hint})"
    if resp.status_code != 200:
        return None  # many servers have no /models: nothing to tell from it
    try:
        served = [m["id"] for m in resp.json().get("data", []) if isinstance(m, dict) and isinstance(m.get("id"), str)]
    except (ValueError, AttributeError):
        return None
    if served and cfg.model not in served:
        listed = ", ".join(served[:10]) + (", …" if len(served) > 10 else "")
        return f"model {name!r}: {cfg.model!r} is not served at {url} (served: {listed})"
    return None


async def probe_models(settings: Settings, names: Iterable[str] | None = None) -> list[str]:
    """One line per configured model (all, or `names`) whose endpoint has a problem; probed concurrently."""
    chosen = [n for n in (settings.models if names is None else names) if n in settings.models]
    found = await asyncio.gather(*(probe_model(n, settings.models[n]) for n in chosen))
    return [line for line in found if line]
