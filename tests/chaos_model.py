"""A faulty OpenAI-compatible model for the chaos test, run as its own process (so kills elsewhere spare it).

Single-tool episodes: a prompt ending in a user message gets a `get_weather` call, one ending in a tool
message gets a text answer. A seeded `--fault-rate` share of requests instead gets one of the faults real
endpoints produce: 500, 429 with Retry-After, a hang past the client's timeout, a 200 that is not JSON, a
connection reset, or a tool call whose arguments are not valid JSON.

    python -m tests.chaos_model --port 8000 --fault-rate 0.3 --seed 1 --hang-s 4
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import struct
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULTS = ("http_500", "http_429", "hang", "not_json", "reset", "bad_tool_json")


def _completion(message: dict) -> bytes:
    return json.dumps({
        "id": f"chatcmpl-{time.monotonic_ns()}", "object": "chat.completion", "created": int(time.time()),
        "model": "chaos", "choices": [{"index": 0, "message": message,
                                       "finish_reason": "tool_calls" if message.get("tool_calls") else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }).encode()


def _tool_call(arguments: str) -> dict:
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{time.monotonic_ns()}", "type": "function",
         "function": {"name": "get_weather", "arguments": arguments}}]}


class _Handler(BaseHTTPRequestHandler):
    server: _ChaosServer

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        fault = self.server.next_fault()
        if fault == "http_500":
            return self._send(500, b'{"error": {"message": "upstream exploded", "type": "server_error"}}')
        if fault == "http_429":
            return self._send(429, b'{"error": {"message": "slow down", "type": "rate_limit"}}',
                              headers={"Retry-After": "1"})
        if fault == "hang":
            time.sleep(self.server.hang_s)
        if fault == "not_json":
            return self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
        if fault == "reset":
            # SO_LINGER 0: close() sends RST, as a crashing proxy does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True
            return None
        last = (body.get("messages") or [{}])[-1]
        if last.get("role") == "tool":
            message: dict = {"role": "assistant", "content": "It is cold there."}
        elif fault == "bad_tool_json":
            message = _tool_call('{"city": ')
        else:
            message = _tool_call('{"city": "SF"}')
        return self._send(200, _completion(message))


class _ChaosServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port: int, fault_rate: float, seed: int, hang_s: float) -> None:
        super().__init__(("127.0.0.1", port), _Handler)
        self.fault_rate, self.hang_s = fault_rate, hang_s
        self._rng, self._lock = random.Random(seed), threading.Lock()

    def next_fault(self) -> str | None:
        with self._lock:
            if self._rng.random() >= self.fault_rate:
                return None
            return self._rng.choice(FAULTS)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fault-rate", type=float, default=0.3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=4.0)
    args = ap.parse_args()
    _ChaosServer(args.port, args.fault_rate, args.seed, args.hang_s).serve_forever()


if __name__ == "__main__":
    main()
