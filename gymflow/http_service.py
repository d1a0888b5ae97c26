"""An HTTP server on a daemon thread, as the scripted model, the bench's mock and the local model server run,
and the rule for where every server of the project listens."""

from __future__ import annotations

import threading
from http.server import HTTPServer
from typing import Self

LOOPBACK = "127.0.0.1"


def listen_host(host: str | None) -> str:
    """The address a server binds: the one the operator named, else loopback. To socket.bind an empty host
    means every interface; none of our servers has authentication enough for that to be a default."""
    return (host or "").strip().strip("[]") or LOOPBACK


class ThreadedHTTPService:
    """`base_url` of its OpenAI-style API, `start`/`stop`, and use as a context manager. Subclasses call
    `_serve(server)` in `__init__`."""

    _server: HTTPServer
    _thread: threading.Thread

    def _serve(self, server: HTTPServer, name: str | None = None) -> None:
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
