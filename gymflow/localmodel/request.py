"""Validate a Chat Completions request body into a `ChatRequest`; anything wrong is a `BadRequest` (HTTP 400)
whose message names the field."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_STOP = 8
MAX_TOP_LOGPROBS = 20


class BadRequest(ValueError):
    def __init__(self, message: str, status: int = 400, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] = field(default_factory=list)
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    ignore_eos: bool = False  # vLLM extension: generate exactly max_tokens (benchmarks)
    model: str | None = None


def _number(body: dict[str, Any], key: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BadRequest(f"`{key}` must be a number, got {type(value).__name__}")
    if value < lo or (lo_open and value == lo) or value > hi:
        raise BadRequest(f"`{key}` must be in {'(' if lo_open else '['}{lo}, {hi}], got {value}")
    return float(value)


def _int(body: dict[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"`{key}` must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise BadRequest(f"`{key}` must be in [{lo}, {hi}], got {value}")
    return value


def _content(i: int, content: Any) -> str:
    """Text content as one string: plain, None, or a list of `{"type": "text"}` parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise BadRequest(f"`messages[{i}].content[{j}]` must be a text part ({{'type': 'text', 'text': ...}}); "
                                 "this model reads text only")
            parts.append(part["text"])
        return "".join(parts)
    raise BadRequest(f"`messages[{i}].content` must be a string, null or a list of text parts")


def _messages(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        raise BadRequest("`messages` is required")
    if not isinstance(raw, list) or not raw:
        raise BadRequest("`messages` must be a non-empty list")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise BadRequest(f"`messages[{i}]` must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise BadRequest(f"`messages[{i}].role` must be one of {sorted(ROLES)}, got {str(role)[:40]!r}")
        calls = m.get("tool_calls")
        if calls is not None and (not isinstance(calls, list) or not all(isinstance(c, dict) for c in calls)):
            raise BadRequest(f"`messages[{i}].tool_calls` must be a list of objects")
        out.append({"role": "system" if role == "developer" else role, "content": _content(i, m.get("content")),
                    "tool_calls": calls or []})
    return out


def _tools(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("`tools` must be a list")
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"`tools[{i}]` must be {{'type': 'function', 'function': {{'name': ..., ...}}}}")
    return raw


def _stop(raw: Any) -> list[str]:
    if raw is None:
        return []
    stops = [raw] if isinstance(raw, str) else raw
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > MAX_STOP:
        raise BadRequest(f"`stop` must be a non-empty string or a list of at most {MAX_STOP} non-empty strings")
    return stops


def parse_request(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    n = body.get("n")
    if n not in (None, 1):
        raise BadRequest("`n` must be 1: this server returns one choice per request")
    if body.get("stream"):
        raise BadRequest("`stream` is not supported by this server")
    for key in ("logprobs", "return_token_ids", "ignore_eos"):
        if body.get(key) is not None and not isinstance(body[key], bool):
            raise BadRequest(f"`{key}` must be a boolean")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("`model` must be a string")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    return ChatRequest(
        messages=_messages(body.get("messages")), tools=_tools(body.get("tools")),
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0), top_p=_number(body, "top_p", 1.0, 0.0, 1.0, True),
        max_tokens=_int({"max_tokens": max_tokens}, "max_tokens", 1, 1 << 20),
        seed=_int(body, "seed", -(1 << 63), (1 << 63) - 1), stop=_stop(body.get("stop")),
        logprobs=bool(body.get("logprobs")), top_logprobs=_int(body, "top_logprobs", 0, MAX_TOP_LOGPROBS) or 0,
        return_token_ids=bool(body.get("return_token_ids")), ignore_eos=bool(body.get("ignore_eos")), model=model)
