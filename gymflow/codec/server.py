"""The codec server's HTTP endpoint: Temporal's codec server protocol over the stdlib's threading server.

`POST [/{namespace}]/decode` and `/encode` take and return `{"payloads": [...]}` (proto3 JSON); `/encode`
is the identity (gymflow encrypts nothing). The Temporal UI calls it from the browser, so it answers CORS
preflights, but only for the configured origins: an id is a guessable integer, and letting any web page
read transcripts from an operator's localhost would leak rollout data. Every request is bounded: body size,
payload count, seconds to send it, requests in flight, and the store's own timeouts (messages.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gymflow.codec.messages import MessageLookup
from gymflow.codec.payloads import BadRequest, Fetch, decode, validate
from gymflow.http_service import listen_host

log = logging.getLogger(__name__)
# What the UI sends: its namespace, and with "pass access token" its bearer token (and the id token as extras).
ALLOW_HEADERS = "content-type,x-namespace,authorization,authorization-extras"
ALLOW_METHODS = "POST,OPTIONS"


def ui_origins(ui_port: int) -> tuple[str, ...]:
    """The origins of a Temporal UI on this machine (a browser names it by whichever host was typed)."""
    return (f"http://localhost:{ui_port}", f"http://127.0.0.1:{ui_port}")


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 8 * 1024 * 1024  # a history event's payloads are a few KB in the episode workflow
    max_payloads: int = 1_000
    max_in_flight: int = 16  # requests being handled; more wait up to `busy_wait_s`, then get a 503
    busy_wait_s: float = 5.0
    read_timeout_s: float = 10.0  # for a client to send its request


class CodecServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck request never holds up shutdown

    def __init__(self, address: tuple[str, int], fetch: Fetch, origins: Sequence[str],
                 limits: Limits = Limits()) -> None:
        self.fetch, self.origins, self.limits = fetch, tuple(origins), limits
        self.in_flight = threading.BoundedSemaphore(limits.max_in_flight)
        super().__init__((listen_host(address[0]), address[1]), _Handler)  # "" is loopback, not every interface

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hung up or timed out mid-request: one debug line, not socketserver's traceback.
        log.debug("codec: connection from %s failed", client_address[0], exc_info=True)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}"

    def allowed_origin(self, origin: str | None) -> str | None:
        """The Access-Control-Allow-Origin value for a request from `origin` (None: not allowed)."""
        if "*" in self.origins:
            return "*"
        return origin if origin in self.origins else None


def _route(path: str) -> str | None:
    """`decode` or `encode` for `/decode`, `/{namespace}/decode` (the CLI's templating) and the like."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if 1 <= len(parts) <= 2 and parts[-1] in ("decode", "encode"):
        return parts[-1]
    return None


class _Handler(BaseHTTPRequestHandler):
    server: CodecServer
    server_version = "gymflow-codec"
    sys_version = ""

    def setup(self) -> None:
        self.timeout = self.server.limits.read_timeout_s  # applied to the socket by StreamRequestHandler
        super().setup()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("codec %s: " + format, self.client_address[0], *args)

    # -- responses ----------------------------------------------------------------------------------
    def _cors(self) -> None:
        allowed = self.server.allowed_origin(self.headers.get("Origin"))
        if allowed is None:
            return
        self.send_header("Access-Control-Allow-Origin", allowed)
        if allowed != "*":
            self.send_header("Vary", "Origin")
            self.send_header("Access-Control-Allow-Credentials", "true")  # the UI's "include credentials"

    def _send(self, status: int, body: dict[str, Any] | None = None) -> None:
        raw = b"" if body is None else json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        self.send_response(status)
        self._cors()
        if body is not None:
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Cache-Control", "no-store")  # transcripts stay out of browser caches
        self.end_headers()
        self.wfile.write(raw)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"error": message})

    # -- methods ------------------------------------------------------------------------------------
    def do_OPTIONS(self) -> None:  # noqa: N802 - http.server's naming
        if _route(self.path) is None:
            return self._error(404, "not found")
        if self.server.allowed_origin(self.headers.get("Origin")) is None:
            return self._error(403, "origin not allowed")
        self.send_response(204)
        self._cors()
        self.send_header("Access-Control-Allow-Methods", ALLOW_METHODS)
        self.send_header("Access-Control-Allow-Headers", ALLOW_HEADERS)
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        if self.path.split("?", 1)[0] == "/healthz":
            return self._send(200, {"status": "ok"})
        self._error(404 if _route(self.path) is None else 405, "POST a payload list to /decode or /encode")

    def do_POST(self) -> None:  # noqa: N802
        if not self.server.in_flight.acquire(timeout=self.server.limits.busy_wait_s):
            return self._error(503, "busy")
        try:
            self._post()
        except Exception:  # noqa: BLE001 - one line in our log, a clean 500 for the caller, never a traceback
            log.exception("codec: request failed")
            self.close_connection = True
            self._error(500, "internal error")
        finally:
            self.server.in_flight.release()

    def _post(self) -> None:
        route = _route(self.path)
        if route is None:
            return self._error(404, "not found")
        origin = self.headers.get("Origin")
        if origin is not None and self.server.allowed_origin(origin) is None:
            return self._error(403, "origin not allowed")  # also defeats DNS rebinding to this port
        if not (self.headers.get("Content-Type") or "").lower().startswith("application/json"):
            return self._error(415, "Content-Type must be application/json")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._error(411, "Content-Length required")
        if length < 0 or length > self.server.limits.max_body_bytes:
            self.close_connection = True  # the body is not read
            return self._error(413, f"body over {self.server.limits.max_body_bytes} bytes")
        try:
            payloads = validate(json.loads(self.rfile.read(length)), self.server.limits.max_payloads)
        except (ValueError, RecursionError) as e:  # JSONDecodeError and BadRequest are ValueErrors
            return self._error(400, str(e) if isinstance(e, BadRequest) else "body is not valid JSON")
        out = decode(payloads, self.server.fetch) if route == "decode" else payloads
        self._send(200, {"payloads": out})


def make_server(database_url: str, port: int, *, bind: str = "127.0.0.1", origins: Sequence[str] = ui_origins(8233),
                limits: Limits = Limits()) -> CodecServer:
    """A codec server bound to `bind:port` (0: a free port), reading messages from `database_url`."""
    return CodecServer((bind, port), MessageLookup(database_url).fetch, origins, limits)


def serve_in_thread(server: CodecServer) -> threading.Thread:
    """Serve until `server.shutdown()`, in a daemon thread (for `gymflow up` and tests)."""
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.5}, name="gymflow-codec",
                              daemon=True)
    thread.start()
    return thread
