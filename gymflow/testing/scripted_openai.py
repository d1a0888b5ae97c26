"""A scripted OpenAI-compatible HTTP server for tests and benchmarks.

It serves queued replies in order (text, tool calls, HTTP errors, delays), then a default reply, and
records every request it received. It is a real HTTP server on 127.0.0.1: workers in other
processes reach it exactly as they would reach vLLM.
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


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


class ScriptedOpenAI:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, default: Reply | None = None,
                 latency_s: float = 0.0, responder: Callable[[dict[str, Any]], Reply] | None = None) -> None:
        self.default = default or text("done")
        self.responder = responder  # answers from the request itself once the script is used up
        self.latency_s = latency_s
        self.requests: list[Seen] = []
        self._queue: deque[Reply] = deque()
        self._lock = threading.Lock()
        self.request_seen = threading.Event()
        self._server = ThreadingHTTPServer((host, port), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

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

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, payload: dict[str, Any] | bytes, headers: dict[str, str] | None = None,
                      content_type: str = "application/json") -> None:
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, {"object": "list", "data": [{"id": "scripted", "object": "model"}]})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                reply = outer._next(dict(self.headers.items()), body)
                if outer.latency_s or reply.delay_s:
                    time.sleep(outer.latency_s + reply.delay_s)
                if reply.disconnect:
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                elif reply.raw is not None:
                    self._send(reply.status, reply.raw, reply.headers, reply.content_type)
                elif reply.status != 200:
                    self._send(reply.status, {"error": reply.error}, reply.headers)
                else:
                    completion = _completion(reply, body.get("model", "scripted"), bool(body.get("return_token_ids")))
                    self._send(200, completion, reply.headers)

        return Handler

    def start(self) -> ScriptedOpenAI:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> ScriptedOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


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
    server._server.serve_forever()


if __name__ == "__main__":
    main()
