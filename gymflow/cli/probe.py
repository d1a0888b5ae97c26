"""Probe each configured model endpoint once (GET {base_url}/models) and say what is wrong in one line: refused,
DNS, TLS, timeout, a rejected key, or a model the endpoint does not serve. Run by `collect` (a failure stops it
before any rollout starts) and `up` / `worker` (a warning: the endpoint may come up later)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable

import httpx

from gymflow.activities.redact import Redactor
from gymflow.kernel.config import ModelConfig, Settings
from gymflow.kernel.endpoints import connect_problem, shown_url

PROBE_TIMEOUT_S = 5.0


async def probe_model(name: str, cfg: ModelConfig, timeout_s: float = PROBE_TIMEOUT_S,
                      keys_elsewhere: bool = False) -> str | None:
    """None when the endpoint answers and serves `cfg.model` (or does not list models); else one line.
    `keys_elsewhere`: this process is not the one that calls the model (`collect`: only workers need the key), so
    a rejection when the key's variable is unset here says nothing about the workers' key."""
    if cfg.base_url is None or cfg.recorded:
        return None  # replayed: no endpoint
    if not cfg.base_url.lower().startswith(("http://", "https://")):
        return None  # not HTTP: nothing to GET
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
        key_here = bool(cfg.api_key_env and os.environ.get(cfg.api_key_env))
        if keys_elsewhere and cfg.api_key_env and not key_here:
            return None
        hint = (f"check the key in ${cfg.api_key_env}" if key_here
                else f"${cfg.api_key_env} is not set" if cfg.api_key_env else "no api_key_env is configured")
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


async def probe_models(settings: Settings, names: Iterable[str] | None = None, keys_elsewhere: bool = False
                       ) -> list[str]:
    """One line per configured model (all, or `names`) whose endpoint has a problem; probed concurrently. The
    lines quote exceptions: any configured secret in them is redacted."""
    chosen = dict.fromkeys(n for n in (settings.models if names is None else names) if n in settings.models)
    found = await asyncio.gather(*(probe_model(n, settings.models[n], keys_elsewhere=keys_elsewhere)
                                   for n in chosen))
    red = Redactor.from_settings(settings)
    return [red.text(line) for line in found if line]


def judge_models(settings: Settings, envs: Iterable[str] | None = None, placement: str | None = None) -> list[str]:
    """The models named as judges (`environments.<env>.judge_model`) of `envs`, default every configured env;
    with `placement`, only of the environments whose options place them there ("local": the workflow pool; judged
    environments default to the env pool)."""
    chosen = settings.environments if envs is None else envs
    options = [settings.environments.get(e, {}) for e in chosen]
    if placement is not None:
        options = [o for o in options if o.get("placement", "pool") == placement]
    return list(dict.fromkeys(n for o in options if isinstance(n := o.get("judge_model"), str) and n))


def pool_models(settings: Settings, pool: str, served: Iterable[str] | None = None) -> list[str]:
    """The models a worker pool calls: the workflow pool generates for models placed "local" and judges for the
    environments placed there; the env pool calls the other judges; the generate pool the models placed "pool"
    among those it serves (`--models`, default all). A model both pools may call is the env pool's to report, so
    that `up`'s pools do not each repeat the same line."""
    models = settings.models
    names: list[str] = []
    if pool in ("workflows", "all"):
        env_judges = set(judge_models(settings, placement="pool"))
        names += [n for n, m in models.items() if m.placement == "local" and n not in env_judges]
        names += judge_models(settings, placement="local")
    if pool in ("env", "all"):
        names += judge_models(settings, placement="pool")
    if pool in ("generate", "all"):
        chosen = models if served is None else [n.strip() for n in served]
        names += [n for n in chosen if n in models and models[n].placement == "pool"]
    return list(dict.fromkeys(names))
