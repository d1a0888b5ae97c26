"""Test-only TLS parts: certificates made with the `openssl` CLI, and a TLS-terminating TCP proxy in front of
the plain Temporal dev server (`temporal server start-dev` has no TLS flags)."""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Certs:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here: trusting it instead of `ca` must fail


def openssl() -> str | None:
    return shutil.which("openssl")


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


def _ca(folder: Path, name: str) -> tuple[Path, Path]:
    key, cert = folder / f"{name}.key", folder / f"{name}.pem"
    _run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
         "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(cert),
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def _leaf(folder: Path, name: str, ca: tuple[Path, Path], ext: str) -> tuple[Path, Path]:
    key, csr, cert, extfile = (folder / f"{name}.key", folder / f"{name}.csr", folder / f"{name}.pem",
                               folder / f"{name}.ext")
    _run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", f"/CN={name}",
         "-keyout", str(key), "-out", str(csr))
    extfile.write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n" + ext)
    _run("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-CAcreateserial",
         "-days", "2", "-extfile", str(extfile), "-out", str(cert))
    return cert, key


def make_certs(folder: Path) -> Certs:
    """A CA, a server cert for `localhost`, a client cert (both signed by the CA), and an unrelated CA."""
    ca = _ca(folder, "ca")
    server = _leaf(folder, "server", ca, "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n")
    client = _leaf(folder, "client", ca, "extendedKeyUsage=clientAuth\n")
    other, _ = _ca(folder, "other-ca")
    return Certs(ca=ca[0], server_cert=server[0], server_key=server[1], client_cert=client[0],
                 client_key=client[1], other_ca=other)


class TLSProxy:
    """Accepts TLS on 127.0.0.1 (client certificate required, signed by `certs.ca`; ALPN h2 for gRPC) and
    forwards the bytes to the plain `backend` host:port. Blocking sockets in threads, so that a refused
    handshake sends its alert (e.g. `certificate required`) before the socket closes, as a real server does."""

    def __init__(self, certs: Certs, backend: str) -> None:
        host, port = backend.rsplit(":", 1)
        self.backend = (host, int(port))
        self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
        self.ctx.load_cert_chain(str(certs.server_cert), str(certs.server_key))
        self.ctx.verify_mode = ssl.CERT_REQUIRED
        self.ctx.set_alpn_protocols(["h2"])
        self.accepted = 0  # handshakes that succeeded
        self.refused: list[str] = []  # why the others failed
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self._stop = threading.Event()
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._listener.getsockname()[1]}"

    def __enter__(self) -> TLSProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._listener.close()
        with self._lock:
            for sock in self._socks:
                with contextlib.suppress(OSError):
                    sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)  # bounds the handshake
        try:
            tls = self.ctx.wrap_socket(conn, server_side=True)
        except (OSError, ssl.SSLError) as err:
            self.refused.append(str(err))
            conn.close()
            return
        try:
            upstream = socket.create_connection(self.backend, timeout=10)
        except OSError:
            tls.close()
            return
        tls.settimeout(None)
        upstream.settimeout(None)
        with self._lock:
            self.accepted += 1
            self._socks += [tls, upstream]
        threading.Thread(target=self._pipe, args=(tls, upstream), daemon=True).start()
        self._pipe(upstream, tls)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except (OSError, ssl.SSLError):
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.close()
