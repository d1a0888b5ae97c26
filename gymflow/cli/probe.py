"""Probe each configured model endpoint once (GET {base_url}/models) and say what is wrong in one line: refused,
DNS, TLS, timeout, a rejected key, or a model the endpoint does not serve. Run by `collect` (a failure stops it
before any rollout starts) and `up` / `worker` (a warning: the endpoint may come up later)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

import httpx

from gymflow.kernel.config import ModelConfig, Settings
from gymflow.kernel.endpoints import connect_problem, shown_url

PROBE_TIMEOUT_S = 5.0


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
        return f"model {name!r}: {connect_problem(url, httpx.URL(cfg.base_url).host, e)}"
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
