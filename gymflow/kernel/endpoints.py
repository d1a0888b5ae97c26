"""What went wrong reaching an HTTP endpoint, in words: refused, DNS, TLS, or another connect failure, with the
URL shown without credentials. Used by the start-up probe (gymflow/cli/probe.py) and the model client's failures."""

from __future__ import annotations

import socket
import ssl

import httpx


def shown_url(base_url: str) -> str:
    """The URL without credentials or query (a key can hide in either)."""
    try:
        u = httpx.URL(base_url)
    except (httpx.InvalidURL, TypeError):
        return "<unparsable URL>"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}"


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc`, what caused it, and an aiohttp connector error's `os_error`: where the real cause hides."""
    out: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo and len(out) < 16:
        e = todo.pop()
        if e is None or any(e is seen for seen in out):
            continue
        out.append(e)
        todo += [e.__cause__, e.__context__, getattr(e, "os_error", None)]
    return out


def failed_to_connect(exc: BaseException) -> bool:
    """Whether the connection itself failed (refused, DNS, TLS), whatever the wrapper says: httpx-aiohttp reports
    a refused connection as a ConnectTimeout."""
    return any(isinstance(e, (ConnectionRefusedError, socket.gaierror, ssl.SSLError)) for e in _chain(exc))


def connect_problem(url: str, host: str, exc: BaseException) -> str:
    """One line for a failed connect (`exc`: the transport error, or one that wraps it)."""
    chain = _chain(exc)
    text = " ".join(str(e) for e in chain).lower()
    root = chain[-1]
    tls = next((e for e in chain if isinstance(e, ssl.SSLError)), None)
    if tls is not None or "certificate verify failed" in text:
        return f"TLS error at {url}: {str(tls or root)[:160]}"
    if any(isinstance(e, socket.gaierror) for e in chain) or "name or service not known" in text \
            or "name resolution" in text or "nodename nor servname" in text:
        return f"DNS lookup failed for {host}"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text \
            or "connect call failed" in text:
        return f"connection refused at {url}"
    return f"cannot connect to {url}: {str(root)[:160] or type(root).__name__}"
