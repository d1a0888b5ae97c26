"""OpenAI-compatible clients per configured model, and the mapping of API errors onto retry decisions.

The SDK's own retries are off: Temporal owns retries. API keys are read here, in the worker, from the
environment variable the config names; they never enter a payload, a log line or a table.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence
from datetime import timedelta
from email.utils import parsedate_to_datetime
from time import time

import openai
from openai import AsyncOpenAI
from temporalio.exceptions import ApplicationError

from gymflow.kernel import errors
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.wire import ChatMessage

_CONTEXT_MARKERS = ("context length", "context_length", "maximum context", "too many tokens",
                    "prompt is too long", "input is too long")
MAX_RETRY_AFTER_S = 600.0


def retry_after_seconds(headers: object) -> float | None:
    """Parse Retry-After (seconds or an HTTP date); None when absent or unreadable."""
    get = getattr(headers, "get", None)
    value = get("retry-after") if get else None
    if not value:
        return None
    try:
        return min(max(float(value), 0.0), MAX_RETRY_AFTER_S)
    except ValueError:
        pass
    try:
        return min(max(parsedate_to_datetime(value).timestamp() - time(), 0.0), MAX_RETRY_AFTER_S)
    except (TypeError, ValueError):
        return None


def is_context_length_error(err: openai.APIStatusError) -> bool:
    code = getattr(err, "code", None) or ""
    text = f"{code} {err.message}".lower()
    return any(m in text for m in _CONTEXT_MARKERS)


def classify(err: Exception, model: str) -> ApplicationError:
    """One place that decides: deterministic (non-retryable, typed) or transient (retry, maybe delayed)."""
    if isinstance(err, openai.RateLimitError):
        delay = retry_after_seconds(err.response.headers)
        return ApplicationError(f"{model}: rate limited (429)", type=errors.RATE_LIMITED,
                                next_retry_delay=timedelta(seconds=delay) if delay is not None else None)
    if isinstance(err, openai.BadRequestError):
        kind = errors.CONTEXT_LENGTH if is_context_length_error(err) else errors.MODEL_BAD_REQUEST
        return ApplicationError(f"{model}: {err.message}", type=kind, non_retryable=True)
    if isinstance(err, (openai.AuthenticationError, openai.PermissionDeniedError)):
        return ApplicationError(f"{model}: endpoint refused the credentials ({err.status_code})",
                                type=errors.MODEL_AUTH, non_retryable=True)
    if isinstance(err, (openai.NotFoundError, openai.UnprocessableEntityError)):
        return ApplicationError(f"{model}: {err.status_code} {err.message}", type=errors.MODEL_BAD_REQUEST,
                                non_retryable=True)
    if isinstance(err, openai.APIStatusError):
        return ApplicationError(f"{model}: HTTP {err.status_code}", type=errors.MODEL_UNAVAILABLE)
    if isinstance(err, openai.APITimeoutError):
        return ApplicationError(f"{model}: request timed out", type=errors.MODEL_UNAVAILABLE)
    if isinstance(err, openai.APIConnectionError):
        return ApplicationError(f"{model}: connection failed", type=errors.MODEL_UNAVAILABLE)
    return ApplicationError(f"{model}: {type(err).__name__}: {err}", type=errors.MODEL_UNAVAILABLE)


class ModelClients:
    """Lazily built clients and per-model concurrency limits for one worker process."""

    def __init__(self, models: dict[str, ModelConfig]) -> None:
        self._models = models
        self._clients: dict[str, AsyncOpenAI] = {}
        self._limits: dict[str, asyncio.Semaphore] = {}

    def config(self, name: str) -> ModelConfig:
        cfg = self._models.get(name)
        if cfg is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise ApplicationError(f"model {name!r} is not configured on this worker (models: {known})",
                                   type=errors.UNKNOWN_MODEL, non_retryable=True)
        return cfg

    def client(self, name: str) -> AsyncOpenAI:
        if name not in self._clients:
            cfg = self.config(name)
            key = os.environ.get(cfg.api_key_env, "") if cfg.api_key_env else ""
            self._clients[name] = AsyncOpenAI(base_url=cfg.base_url, api_key=key or "EMPTY", max_retries=0,
                                              timeout=cfg.request_timeout_s)
        return self._clients[name]

    def limit(self, name: str) -> asyncio.Semaphore:
        if name not in self._limits:
            self._limits[name] = asyncio.Semaphore(self.config(name).concurrency)
        return self._limits[name]

    async def chat(self, name: str, messages: Sequence[ChatMessage]) -> str:
        """Plain text completion, for judges. Raises ApplicationError classified like generation."""
        cfg = self.config(name)
        async with self.limit(name):
            try:
                resp = await self.client(name).chat.completions.create(
                    model=cfg.model, messages=[m.to_openai() for m in messages])  # type: ignore[misc]
            except openai.OpenAIError as e:
                raise classify(e, name) from None
        return resp.choices[0].message.content or ""

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()
