"""A scripted OpenAI-compatible HTTP server for tests and benchmarks.

It serves queued replies in order (text, tool calls, HTTP errors, delays), then a default reply, and
records every request it received. It is a real HTTP server on 127.0.0.1: workers in other
processes reach it exactly as they would reach vLLM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gymflow.http_service import ThreadedHTTPService, json_app, read_body

MAX_BODY_BYTES = 64 * 1024 * 1024


@dataclass
class Reply:
    content: str | None = "ok"
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, raw JSON arguments)
    status: int = 200
    error: dict[str, Any] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    logprobs: bool = False
    prompt_tokens: int = 10
    completion_tokens: int | None = None
    token_ids: list[int] | None = None
    raw: bytes | None = None  # sent as the body as it is (with `status` and `content_type`): garbage servers
    content_type: str = "application/json"
    disconnect: bool = False  # close the connection without answering (a reset mid-request)


def text(content: str, **kw: Any) -> Reply:
    return Reply(content=content, **kw)


def tool_call(name: str, arguments: str | dict[str, Any], **kw: Any) -> Reply:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return Reply(content=None, tool_calls=[(name, raw)], **kw)


def http_error(status: int, message: str, *, code: str | None = None, headers: dict[str, str] | None = None,
               delay_s: float = 0.0) -> Reply:
    err = {"message": message, "type": "invalid_request_error" if status < 500 else "server_error", "code": code}
    return Reply(status=status, error=err, headers=headers or {}, delay_s=delay_s)


def raw_body(body: bytes | str, content_type: str = "application/json", status: int = 200, **kw: Any) -> Reply:
    """A reply whose body is exactly `body`: non-JSON, HTML, a partial or malformed completion."""
    data = body.encode() if isinstance(body, str) else body
    return Reply(raw=data, content_type=content_type, status=status, **kw)


def completion_json(payload: Any, **kw: Any) -> Reply:
    """A 200 JSON reply with `payload` as the whole body (e.g. `{"choices": []}`)."""
    return raw_body(json.dumps(payload), **kw)


def disconnect(**kw: Any) -> Reply:
    return Reply(disconnect=True, **kw)


def context_length_error() -> Reply:
    return http_error(400, "This model's maximum context length is 4096 tokens. However, you requested "
                           "9000 tokens. Please reduce the length of the messages.",
                      code="context_length_exceeded")


@dataclass
class Seen:
    at: float
    headers: dict[str, str]
    body: dict[str, Any]


def _completion(reply: Reply, model: str, token_ids: bool = False) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": f"call_{i}_{time.monotonic_ns()}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(reply.tool_calls)
        ]
    words = (reply.content or "").split() or ["x"]
    completion_tokens = reply.completion_tokens if reply.completion_tokens is not None else len(words)
    choice: dict[str, Any] = {"index": 0, "message": message,
                              "finish_reason": "tool_calls" if reply.tool_calls else "stop"}
    if reply.logprobs:
        choice["logprobs"] = {"content": [{"token": f"t{i}", "logprob": -0.5, "bytes": None, "top_logprobs": []}
                                          for i in range(completion_tokens)]}
    out: dict[str, Any] = {
        "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "choices": [choice],
        "usage": {"prompt_tokens": reply.prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": reply.prompt_tokens + completion_tokens}}
    if token_ids or reply.token_ids is not None:  # vLLM's `return_token_ids` response fields
        choice["token_ids"] = reply.token_ids or list(range(1000, 1000 + completion_tokens))
        out["prompt_token_ids"] = list(range(reply.prompt_tokens))
    return out


# Tokenizer mode (`ScriptedOpenAI(tokenizer=...)`): token ids like vLLM's `return_token_ids`, derived from the
# request's messages by a fixed chat rendering (UTF-8 bytes plus special ids), so the same conversation always
# gives the same ids and turn k+1's prompt starts with turn k's prompt + generation. "drift" re-templates
# earlier assistant turns (an extra marker token), as a template that rewrites history does.
TOKENIZER_MODES = ("deterministic", "drift")
ROLE_IDS = {"system": 256, "user": 257, "assistant": 258, "tool": 259}
END_ID, CALL_ID, OTHER_ROLE_ID, DRIFT_ID = 260, 261, 262, 263


def _utf8(value: Any) -> list[int]:
    return list(str(value).encode("utf-8", "replace")) if value is not None else []


def assistant_token_ids(content: Any, tool_calls: Any) -> list[int]:
    """The ids of an assistant turn's body followed by its end token: what the policy generated."""
    ids = _utf8(content)
    for c in tool_calls or ():
        fn = c.get("function") if isinstance(c, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        ids += [CALL_ID, *_utf8(fn.get("name")), CALL_ID, *_utf8(fn.get("arguments"))]
    return ids + [END_ID]


def prompt_token_ids(messages: list[Any], drift: bool = False) -> list[int]:
    """The rendered conversation followed by the assistant header (the generation prompt)."""
    ids: list[int] = []
    for m in messages:
        m = m if isinstance(m, dict) else {}
        role = m.get("role")
        ids.append(ROLE_IDS.get(role, OTHER_ROLE_ID))
        if role == "assistant":
            ids += ([DRIFT_ID] if drift else []) + assistant_token_ids(m.get("content"), m.get("tool_calls"))
        else:
            ids += [*_utf8(m.get("content")), END_ID]
    return ids + [ROLE_IDS["assistant"]]


def token_logprob(token_id: int) -> float:
    """The logprob tokenizer mode reports for a generated token: a function of the id, to check alignment."""
    return -((token_id % 97) + 1) / 100


def _tokenize(completion: dict[str, Any], body: dict[str, Any], mode: str) -> None:
    choice = completion["choices"][0]
    gen = assistant_token_ids(choice["message"].get("content"), choice["message"].get("tool_calls"))
    prompt = prompt_token_ids(body.get("messages") or [], drift=mode == "drift")
    if body.get("return_token_ids"):
        choice["token_ids"], completion["prompt_token_ids"] = gen, prompt
    if body.get("logprobs"):
        choice["logprobs"] = {"content": [{"token": f"t{t}", "logprob": token_logprob(t), "bytes": None,
                                           "top_logprobs": []} for t in gen]}
    completion["usage"] = {"prompt_tokens": len(prompt), "completion_tokens": len(gen),
                           "total_tokens": len(prompt) + len(gen)}


class ScriptedOpenAI(ThreadedHTTPService):
    def __init__(self, host: str = "127.0.0.1", port: int = 0, default: Reply | None = None,
                 latency_s: float = 0.0, responder: Callable[[dict[str, Any]], Reply] | None = None,
                 tokenizer: str | None = None) -> None:
        if tokenizer is not None and tokenizer not in TOKENIZER_MODES:
            raise ValueError(f"tokenizer must be one of {TOKENIZER_MODES} or None, got {tokenizer!r}")
        self.tokenizer = tokenizer  # may be switched between requests (tests share one server)
        self.default = default or text("done")
        self.responder = responder  # answers from the request itself once the script is used up
        self.latency_s = latency_s
        self.requests: list[Seen] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self.request_seen = threading.Event()
        app = json_app(self._get, self._post, MAX_BODY_BYTES)
        self._serve(app, host, port)

    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._queue.extend(replies)

    def reset(self) -> None:
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.request_seen.clear()

    def _next(self, headers: dict[str, str], body: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(Seen(time.monotonic(), headers, body))
            if self._queue:
                reply = self._queue.popleft()
            else:
                reply = self.responder(body) if self.responder else self.default
        self.request_seen.set()
        return reply

    async def _get(self, request: web.Request) -> web.Response:
        # It answers whatever model a request names, so it lists none (`gymflow/cli/probe.py` then checks nothing).
        return _json(200, {"object": "list", "data": []})

    async def _post(self, request: web.Request) -> web.StreamResponse:
        raw = await read_body(request, MAX_BODY_BYTES)
        if raw is None:
            return _json(413, {"error": {"message": f"the request body is over {MAX_BODY_BYTES} bytes",
                                         "type": "invalid_request_error", "code": None}}, close=True)
        try:
            body = json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError):
            return _json(400, {"error": {"message": "the request body is not valid JSON",
                                         "type": "invalid_request_error", "code": None}}, close=True)
        reply = self._next(dict(request.headers.items()), body)
        if self.latency_s or reply.delay_s:
            await asyncio.sleep(self.latency_s + reply.delay_s)
        if reply.disconnect:  # close without answering; aiohttp then finds the transport closed and writes nothing
            if request.transport is not None:
                request.transport.close()
            return web.Response()
        if reply.raw is not None:
            return _json(reply.status, reply.raw, reply.headers, reply.content_type)
        if reply.status != 200:
            return _json(reply.status, {"error": reply.error}, reply.headers)
        completion = _completion(reply, body.get("model", "scripted"), bool(body.get("return_token_ids")))
        if self.tokenizer:
            _tokenize(completion, body, self.tokenizer)
        return _json(200, completion, reply.headers)


def _json(status: int, payload: Any, headers: dict[str, str] | None = None,
          content_type: str = "application/json", close: bool = False) -> web.Response:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    resp = web.Response(status=status, body=data, headers={"Content-Type": content_type, **(headers or {})})
    if close:
        resp.force_close()
    return resp


def weather_responder(body: dict[str, Any]) -> Reply:
    """A stand-in policy for the single-tool demo: call get_weather once, then answer from its result."""
    last = (body.get("messages") or [{}])[-1]
    if last.get("role") == "tool":
        return text(f"Here is what I found: {last.get('content')}")
    if body.get("tools"):
        return tool_call("get_weather", {"city": "San Francisco"})
    return text("I can't check the weather without a tool.")


def main() -> None:
    ap = argparse.ArgumentParser(description="Serve scripted Chat Completions (default reply only).")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--latency", type=float, default=0.0, help="seconds before each reply")
    ap.add_argument("--reply", default="The answer is 42.")
    args = ap.parse_args()
    server = ScriptedOpenAI(port=args.port, default=text(args.reply), latency_s=args.latency)
    print(server.base_url, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
