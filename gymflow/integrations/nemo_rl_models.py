"""Which gymflow models NeMo RL's vLLM HTTP servers are (gymflow/integrations/nemo_rl.py): matched by base URL in
the workers' config, each asked for token ids and logprobs, or the `models:` entries to add."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gymflow.kernel.config import Settings
from gymflow.kernel.errors import ConfigError

CONFIG_KEY = "gymflow"  # env.nemo_gym.gymflow in NeMo RL's config: gymflow's own settings


def _norm(url: str) -> str:
    return url.rstrip("/")


def resolve_models(settings: Settings, base_urls: list[str], model_name: str, explicit: Any = None) -> list[str]:
    """The gymflow model (from the workers' config) for each of NeMo RL's base URLs: the one whose base_url is it.
    It must ask for token ids and logprobs and send NeMo RL's served model name."""
    if explicit is not None:
        names = [explicit] if isinstance(explicit, str) else list(explicit)
        missing = [n for n in names if n not in settings.models]
        if missing:
            raise ConfigError(f"env.nemo_gym.{CONFIG_KEY}.model: {', '.join(map(repr, missing))} not configured in "
                              f"gymflow's models ({', '.join(sorted(settings.models)) or 'none'})")
    else:
        if not base_urls:
            raise ConfigError("NeMo RL passed no base_urls (policy.generation.vllm_cfg.expose_http_server: true)")
        names = []
        for url in base_urls:
            match = [n for n, m in settings.models.items() if m.base_url and _norm(m.base_url) == _norm(url)]
            if not match:
                raise ConfigError(f"no gymflow model serves NeMo RL's base URL {url}: add to the workers' config "
                                  f"{json.dumps(model_entries(base_urls, model_name))} (under models)")
            # Several entries may share an endpoint (a judge, another served name): prefer the usable one.
            fit = [n for n in match if _token_exact(settings, n) and (not model_name or
                                                                      settings.models[n].model == model_name)]
            names.append((fit or match)[0])
    problems = []
    for n in dict.fromkeys(names):
        m = settings.models[n]
        if not _token_exact(settings, n):
            problems.append(f"models.{n}: set return_token_ids: true and logprobs: true (NeMo RL trains on the "
                            "server's token ids and logprobs)")
        if model_name and m.model != model_name:
            problems.append(f"models.{n}.model is {m.model!r}, NeMo RL serves {model_name!r}")
    if problems:
        raise ConfigError("; ".join(problems))
    return list(names)


def _token_exact(settings: Settings, name: str) -> bool:
    m = settings.models[name]
    return bool(m.return_token_ids and m.logprobs)


def model_entries(base_urls: Sequence[str], model_name: str, prefix: str = "nemo_rl_policy") -> dict[str, Any]:
    """gymflow `models:` entries for NeMo RL's vLLM HTTP servers (one per data-parallel rank)."""
    return {(prefix if len(base_urls) == 1 else f"{prefix}_{i}"): {
        "base_url": url, "model": model_name, "logprobs": True, "return_token_ids": True}
        for i, url in enumerate(base_urls)}
