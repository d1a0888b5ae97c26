"""An aiohttp app on its own event loop in a daemon thread, as the scripted model, the bench's mock and the local
model server run, and the rule for where every server of the project listens."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from typing import Self

from aiohttp import web

log = logging.getLogger(__name__)
LOOPBACK = "127.0.0.1"
START_TIMEOUT_S = 30  # the port is bound already: only the loop and the runner have to start
MAX_LINE_BYTES = 65_536  # request line and each header line: http.server's limit, which these servers had before


def listen_host(host: str | None) -> str:
    """The address a server binds: the one the operator named, else loopback. To socket.bind an empty host
    means every interface; none of our servers has authentication enough for that to be a default."""
    return (host or "").strip().strip("[]") or LOOPBACK


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_app(get: Handler, post: Handler, max_body_bytes: int) -> web.Application:
    """An app that sends every GET path to `get` and every POST to `post` (they route by `request.path`);
    aiohttp reads no more than `max_body_bytes` of a body (pass the same to `read_body`)."""
    app = web.Application(client_max_size=max_body_bytes)
    app.router.add_get("/{path:.*}", get)
    app.router.add_post("/{path:.*}", post)
    return app


async def read_body(request: web.Request, max_bytes: int) -> bytes | None:
    """The request's body, or None when it is over `max_bytes`: refused unread when Content-Length says so
    (answer with `force_close()`: the connection cannot carry another request), else stopped at the limit."""
    if (request.content_length or 0) > max_bytes:
        return None
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        return None


class ThreadedHTTPService:
    """`base_url` of its OpenAI-style API, `start`/`stop` (a daemon thread), `serve_forever` (this thread), and
    use as a context manager. Subclasses call `_serve(app, host, port)` in `__init__`: the port is bound there,
    so a bad address fails in the constructor and `base_url` is known before `start`."""

    shutdown_timeout_s = 0.25  # at `stop`, in-flight requests get this long to finish, then as long to cancel
    _app: web.Application
    _sock: socket.socket

    def _serve(self, app: web.Application, host: str, port: int, name: str | None = None,
               backlog: int = 128) -> None:
        self._app, self._name, self._backlog = app, name, backlog
        self._sock = socket.create_server((host, port), backlog=backlog)
        self.server_address: tuple[str, int] = self._sock.getsockname()[:2]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        host, port = self.server_address
        return f"http://{host!s}:{port}/v1"

    async def _main(self, started: Future) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        runner = web.AppRunner(self._app, access_log=None, shutdown_timeout=self.shutdown_timeout_s,
                               keepalive_timeout=75, max_line_size=MAX_LINE_BYTES, max_field_size=MAX_LINE_BYTES)
        await runner.setup()
        try:
            await web.SockSite(runner, self._sock, backlog=self._backlog).start()
            started.set_result(None)
            await self._stopping.wait()
        finally:
            await runner.cleanup()

    def _run(self, started: Future) -> None:
        try:
            asyncio.run(self._main(started))
        except BaseException as e:  # on a daemon thread: to `start`'s caller, or to the log
            if started.done():
                log.exception("%s stopped serving", self._name or type(self).__name__)
            else:
                started.set_exception(e)
        finally:
            self._sock.close()

    def start(self) -> Self:
        started: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name=self._name, daemon=True)
        self._thread.start()
        started.result(timeout=START_TIMEOUT_S)  # serving, or the reason it could not
        return self

    def serve_forever(self) -> None:
        """Serve in the calling thread until `stop` (from another thread) or Ctrl-C (KeyboardInterrupt)."""
        try:
            asyncio.run(self._main(Future()))
        finally:
            self._sock.close()

    def stop(self) -> None:
        loop, stopping = self._loop, self._stopping
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop is already closed
                pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.shutdown_timeout_s + 10)
        self._sock.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
