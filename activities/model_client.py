"""OpenAI-compatible clients per configured model, and the mapping of API errors onto retry decisions.

The SDK's own retries are off: Temporal owns retries. API keys are read here, in the worker, from the
environment variable the config names; they never enter a payload, a log line or a table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from email.utils import parsedate_to_datetime
from time import monotonic, time
from typing import Annotated, Any

import httpx
import openai
from gymflow.activities import redact
from openai import AsyncOpenAI, DefaultAioHttpClient
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.exceptions import ApplicationError

from gymflow.kernel import errors
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.endpoints import connect_problem, failed_to_connect, shown_url
from gymflow.kernel.failures import short_message
from gymflow.kernel.logfilter import ACTIVITY_LOGGER, ExpectedFailureFilter, expected_failure
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


class _Lax(BaseModel):
    model_config = ConfigDict(extra="ignore")


class _Function(_Lax):
    name: str
    arguments: str | None = None


class _Call(_Lax):
    id: str | None = None
    function: _Function


class CompletionMessage(_Lax):
    content: str | None = None
    tool_calls: list[_Call] | None = None
    reasoning_content: Any = None
    reasoning: Any = None


# A hostile endpoint's numbers are bounded where they are read: a usage of -5 or 10**30 once failed the rollout as
# internal_error (the Prometheus counter) or store_unavailable (Postgres' integer range). Out of range: the 200 is
# not a usable completion (model_bad_response).
_Count = Annotated[int, Field(ge=0, le=2**31 - 1)]
_TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class _Token(_Lax):
    logprob: float = Field(allow_inf_nan=False)


class _Logprobs(_Lax):
    content: list[_Token] | None = None


class CompletionChoice(_Lax):
    message: CompletionMessage
    finish_reason: str | None = None
    logprobs: _Logprobs | None = None
    token_ids: list[_TokenId] | None = None  # vLLM `return_token_ids`
    prompt_token_ids: list[_TokenId] | None = None


class _Usage(_Lax):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None


class Completion(_Lax):
    """The part of a Chat Completions response that gymflow reads, validated before anything uses it."""

    choices: list[CompletionChoice] = Field(min_length=1)
    usage: _Usage | None = None
    prompt_token_ids: list[_TokenId] | None = None
    policy_version: Any = None  # a server's own weights tag; checked in kernel/store/policy_versions.py


def bad_response(model: str, why: str) -> ApplicationError:
    # Retryable: a proxy's error page or an overloaded server may answer properly next time; the activity's
    # retry policy bounds it.
    return ApplicationError(short_message(f"{model}: the endpoint answered 200 without a usable chat completion "
                                          f"({why})"), type=errors.MODEL_BAD_RESPONSE)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _no_surrogates(value: Any) -> Any:
    """A lone surrogate (a JSON escape like \\ud800) cannot be encoded as UTF-8: no payload or row could carry
    it. Replace it with U+FFFD, as a decoder would."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_no_surrogates(v) for v in value]
    if isinstance(value, dict):
        return {_no_surrogates(k): _no_surrogates(v) for k, v in value.items()}
    return value


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    # Python's json accepts NaN and Infinity; Postgres' JSON, Prometheus and Temporal's payloads do not.
    raise _NonFinite(name)


def parse_completion(body: bytes, content_type: str, model: str) -> Completion:
    """Validate a 200 response body; anything that is not a chat completion is `model_bad_response`."""
    try:
        data = json.loads(body, parse_constant=_no_constant)
    except _NonFinite as e:
        raise bad_response(model, f"a JSON body with {e} in it, which JSON does not allow") from None
    except (ValueError, UnicodeDecodeError):
        kind = content_type.split(";")[0].strip() or "no content type"
        # Redacted before it is cut: a quoted prefix of a key would not match it later.
        quoted = redact.current().text(body[:4096].decode("utf-8", "replace"))[:80]
        raise bad_response(model, f"{kind} body that is not JSON: {quoted!r}") from None
    if b"\\ud" in body.lower():
        data = _no_surrogates(data)
    try:
        return Completion.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        msg = re.sub(r" or instance of \w+", "", first["msg"])  # our private model names mean nothing to a user
        raise bad_response(model, f"{where}: {msg}") from None


def classify(err: Exception, model: str, timeout_s: float | None = None) -> ApplicationError:
    """One place that decides: deterministic (non-retryable, typed) or transient (retry, maybe delayed). The
    endpoint's own text (its error message, a body it quoted) has the worker's secrets redacted first: a 400 that
    echoes the request's key must not put it in history, the log or the rollout row. `timeout_s`: the request
    timeout, named in a timeout's message."""
    typed = _classify(err, model, timeout_s)
    message = short_message(redact.current().text(typed.message))  # redacted, then cut
    if message == typed.message:
        return typed
    return ApplicationError(message, type=typed.type, non_retryable=typed.non_retryable,
                            next_retry_delay=typed.next_retry_delay)


def _where(err: openai.APIConnectionError) -> tuple[str, str]:
    """(the URL without credentials, its host) of the failed request."""
    try:
        url = err.request.url
    except (AttributeError, RuntimeError):
        return "<unknown URL>", "<unknown host>"
    return shown_url(str(url)), url.host


def _causes(err: BaseException) -> Iterator[BaseException]:
    """`err` and what caused it (bounded: a cycle or a long chain ends the walk)."""
    seen: list[BaseException] = []
    e: BaseException | None = err
    while e is not None and len(seen) < 16 and not any(e is s for s in seen):
        seen.append(e)
        yield e
        e = e.__cause__ or e.__context__


def _timed_out(err: BaseException) -> bool:
    """Whether a wait ran out: a TimeoutError below the wrappers (aiohttp's are asyncio.TimeoutErrors), or a
    timeout error with nothing below it. httpx-aiohttp maps any aiohttp connection error (a reset, a disconnect)
    to a ConnectTimeout, so the wrapper's own class says nothing."""
    chain = list(_causes(err))
    if any(isinstance(e, TimeoutError) for e in chain):
        return True
    return isinstance(chain[-1], (openai.APITimeoutError, httpx.TimeoutException))


def _classify(err: Exception, model: str, timeout_s: float | None = None) -> ApplicationError:
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
    if isinstance(err, openai.APITimeoutError) and _timed_out(err) and not failed_to_connect(err):
        after = f" after {timeout_s:g} s" if timeout_s else ""
        return ApplicationError(f"{model}: timed out{after} at {_where(err)[0]}", type=errors.MODEL_UNAVAILABLE)
    if isinstance(err, openai.APIConnectionError):  # refused, DNS, TLS: said as what it is, with the URL
        url, host = _where(err)
        return ApplicationError(f"{model}: {connect_problem(url, host, err)}", type=errors.MODEL_UNAVAILABLE)
    if isinstance(err, (openai.APIResponseValidationError, ValueError)):  # incl. JSON errors of a 200 body
        return bad_response(model, short_message(redact.current().text(str(err)), 200))
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
            # aiohttp under the client (openai[aiohttp], the SDK's documented option): ~0.6 ms of CPU per call
            # against ~1.4 ms for the default httpx transport (docs/benchmarks.md).
            self._clients[name] = AsyncOpenAI(base_url=cfg.base_url, api_key=key or "EMPTY", max_retries=0,
                                              timeout=cfg.request_timeout_s, http_client=DefaultAioHttpClient())
        return self._clients[name]

    def limit(self, name: str) -> asyncio.Semaphore:
        if name not in self._limits:
            self._limits[name] = asyncio.Semaphore(self.config(name).concurrency)
        return self._limits[name]

    async def create(self, name: str, body: dict[str, Any]) -> Completion:
        """One Chat Completions call, validated. Raises ApplicationError classified by `classify`."""
        payload = dict(body)  # create()'s keyword conventions: extra_headers, extra_body merged into the body
        headers = payload.pop("extra_headers", None) or {}
        payload.update(payload.pop("extra_body", None) or {})
        try:
            # The client's own request path (auth, timeout, status errors), without create()'s per-call transform
            # of the body against its TypedDicts: it walked every message and tool, ~5% of the CPU of a workflow
            # pool that calls the model (docs/benchmarks.md). The body is ours; the response is validated below.
            http = await self.client(name).post("/chat/completions", body=payload, cast_to=httpx.Response,
                                                options={"headers": headers})
            return parse_completion(await http.aread(), http.headers.get("content-type", ""), name)
        except (openai.OpenAIError, ValueError) as e:
            raise classify(e, name, self.config(name).request_timeout_s) from None

    async def limited_create(self, name: str, body: dict[str, Any]) -> Completion:
        """`create` within the model's per-process concurrency limit (waiting for a slot included)."""
        async with self.limit(name):
            return await self.create(name, body)

    async def chat(self, name: str, messages: Sequence[ChatMessage]) -> str:
        """Plain text completion, for judges. Raises ApplicationError classified like generation."""
        cfg = self.config(name)
        async with self.limit(name):
            resp = await self.create(name, {"model": cfg.model, "messages": [m.to_openai() for m in messages]})
        return resp.choices[0].message.content or ""

    async def close(self) -> None:
        for c in self._clients.values():
            await c.close()


# -- the worker's log: one warning per (model, cause) per interval ---------------------------------------------------

WARN_EVERY_S = 60.0
_SDK_FAILURE_MARK = "__temporal_error_identifier"  # the `extra` the SDK puts on its failed-attempt record
# The endpoint's own trouble: every rollout in flight fails the same way, attempt after attempt (10 rollouts on a
# refused endpoint once logged 60 identical lines). A 400 or a context overflow is about one rollout: not grouped.
REPEATED_TYPES = frozenset({errors.MODEL_UNAVAILABLE, errors.RATE_LIMITED, errors.MODEL_BAD_RESPONSE,
                            errors.MODEL_AUTH})


class RepeatedModelFailures(ExpectedFailureFilter):
    """ExpectedFailureFilter's one line per failed attempt, and for a model endpoint's failure at most one such
    line per (model, cause) per `every_s`: the next one shown says how many were held back since the last. The
    failure's message names both (`policy: connection refused at URL`), so it is the key."""

    def __init__(self, every_s: float = WARN_EVERY_S, clock: Callable[[], float] = monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._shown: dict[tuple[str, str], float] = {}
        self._held: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()  # records come from the loop and from activity threads

    def filter(self, record: logging.LogRecord) -> bool:
        sdk_failure = getattr(record, _SDK_FAILURE_MARK, None) == "ActivityFailure"
        err = expected_failure(record.exc_info[1]) if sdk_failure and record.exc_info else None
        if err is None or err.type not in REPEATED_TYPES:
            return super().filter(record)
        key = (err.type, err.message)
        with self._lock:
            now = self.clock()
            if now - self._shown.get(key, -math.inf) < self.every_s:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._shown[key] = now
            held = self._held.pop(key, 0)
        super().filter(record)  # the one-line form, then the count after it
        if held:
            record.msg, record.args = (f"{record.getMessage()} ({held} more like it since the last one shown, "
                                       f"at most one per {self.every_s:g} s)"), ()
        return True


def quiet_repeated_failures(every_s: float = WARN_EVERY_S) -> None:
    """Replace the activity logger's ExpectedFailureFilter with RepeatedModelFailures (idempotent)."""
    logger = logging.getLogger(ACTIVITY_LOGGER)
    if any(isinstance(f, RepeatedModelFailures) for f in logger.filters):
        return
    for f in [f for f in logger.filters if isinstance(f, ExpectedFailureFilter)]:
        logger.removeFilter(f)
    logger.addFilter(RepeatedModelFailures(every_s))
