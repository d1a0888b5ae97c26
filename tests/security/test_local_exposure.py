"""What another user of the same machine can reach: listening sockets and the stack's state on disk.

Every server of the project binds 127.0.0.1 unless the operator names an address (an empty host, which
socket.bind reads as every interface, is loopback too). The embedded stack's state (every workflow
history and transcript) is readable by its owner only. The stack here is the session's real one
(tests/conftest.py), started the way `gymflow up` starts it."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psutil
import pytest
from gymflow.workers import metrics
from gymflow.workers.local_stack import LocalStack, StackAddresses, free_port, private_file

from gymflow.codec.server import CodecServer
from gymflow.http_service import listen_host
from gymflow.kernel.errors import ConfigError
from gymflow.testing.scripted_openai import ScriptedOpenAI

LOOPBACKS = {"127.0.0.1", "::1"}


def listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]


def non_loopback_address() -> str | None:
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                return a.address
    return None


# ---- listeners ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("bind, expected", [
    (":9464", ("127.0.0.1", 9464)), (" :9464 ", ("127.0.0.1", 9464)), ("[::1]:9464", ("::1", 9464)),
    ("0.0.0.0:9464", ("0.0.0.0", 9464)), ("10.1.2.3:1", ("10.1.2.3", 1)),
])
def test_metrics_bind_empty_host_is_loopback(bind: str, expected: tuple[str, int]) -> None:
    assert metrics.split_bind(bind) == expected


@pytest.mark.parametrize("bind", ["9464", "host:", "host:70000", "host:-1", "host:abc", ""])
def test_metrics_bind_that_is_not_host_port_is_an_error(bind: str) -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        metrics.split_bind(bind)


def test_metrics_on_a_bare_port_is_unreachable_from_other_interfaces() -> None:
    port = free_port()
    metrics.start_server(f":{port}")
    assert ("127.0.0.1", port) in listening(os.getpid())
    assert not [a for a in listening(os.getpid()) if a[1] == port and a[0] not in LOOPBACKS]
    other = non_loopback_address()
    if other is not None:  # the attack: scrape it from another interface of this machine
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((other, port)) != 0


@pytest.mark.parametrize("host", ["", "  ", None, "[127.0.0.1]"])
def test_an_empty_host_never_means_every_interface(host: str | None) -> None:
    assert listen_host(host) == "127.0.0.1"
    codec = CodecServer((host or "", 0), lambda ids: {}, ["http://localhost:8233"])
    try:
        assert codec.server_address[0] == "127.0.0.1"
    finally:
        codec.server_close()


def test_test_servers_default_to_loopback() -> None:
    with ScriptedOpenAI() as server:
        assert server.server_address[0] == "127.0.0.1"


def test_the_temporal_dev_server_and_its_ui_are_told_loopback(tmp_path: Path) -> None:
    cmd = LocalStack(tmp_path, port=7000, ui_port=7001).temporal_command()
    assert cmd[cmd.index("--ip") + 1] == "127.0.0.1" and cmd[cmd.index("--ui-ip") + 1] == "127.0.0.1"
    assert "--ui-ip" not in LocalStack(tmp_path, headless=True).temporal_command()  # no UI at all


def temporal_process(stack: StackAddresses) -> psutil.Process:
    port = int(stack.temporal_address.rsplit(":", 1)[1])
    for proc in psutil.Process().children(recursive=True):
        try:
            if "start-dev" in proc.cmdline() and str(port) in proc.cmdline():
                return proc
        except psutil.NoSuchProcess:
            continue
    pytest.skip("Temporal is not the one this session started (TEMPORAL_ADDRESS is set)")


def postgres_processes(pgdata: Path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "postgres" and str(pgdata) in " ".join(p.info["cmdline"] or [])]


def test_the_stack_listens_on_loopback_only(stack: StackAddresses) -> None:
    temporal = temporal_process(stack)
    sockets = listening(temporal.pid)
    assert sockets and all(ip in LOOPBACKS for ip, _ in sockets), sockets  # gRPC, HTTP API, metrics, services
    pgdata = state_dir(stack) / "postgres"
    servers = postgres_processes(pgdata)
    assert servers, f"no postgres process for {pgdata}"
    assert all(not listening(p.pid) for p in servers)  # a Unix socket only, no TCP port


# ---- the stack's state on disk -----------------------------------------------------------------------------


def state_dir(stack: StackAddresses) -> Path:
    cmd = temporal_process(stack).cmdline()
    return Path(cmd[cmd.index("--db-filename") + 1]).parent


def postgres_socket(stack: StackAddresses) -> Path:
    host = parse_qs(urlparse(stack.database_url).query)["host"][0]
    return Path(host) / ".s.PGSQL.5432"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_the_state_is_its_owners_only(stack: StackAddresses) -> None:
    state = state_dir(stack)
    pgdata = state / "postgres"
    assert mode(state) & 0o077 in (0, 0o011), oct(mode(state))  # 0711 only for Postgres' own user to pass
    files = [p for p in state.iterdir() if p.is_file()]
    assert {p.name for p in files} >= {"temporal.db", "temporal.log"}
    assert all(mode(p) & 0o077 == 0 for p in files), {p.name: oct(mode(p)) for p in files}
    owner = psutil.Process(postgres_processes(pgdata)[0].pid).uids().real
    assert mode(pgdata) == 0o700 and pgdata.stat().st_uid == owner
    assert mode(postgres_socket(stack)) & 0o077 == 0  # trust auth: the socket is the only lock


_AS_ANOTHER_USER = r'''
import os, socket, sys
state, pgsock = sys.argv[1], sys.argv[2]
def attempt(label, fn):
    try:
        fn()
        print(label, "ok")
    except OSError as e:
        print(label, type(e).__name__)
def connect():
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(pgsock)
attempt("list-state", lambda: os.listdir(state))
attempt("read-history", lambda: open(os.path.join(state, "temporal.db"), "rb").read(1))
attempt("read-wal", lambda: open(os.path.join(state, "temporal.db-wal"), "rb").read(1))
attempt("read-log", lambda: open(os.path.join(state, "temporal.log"), "rb").read(1))
attempt("list-pgdata", lambda: os.listdir(os.path.join(state, "postgres")))
attempt("postgres-socket", connect)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="becoming another local user needs root")
def test_another_local_user_reads_nothing_of_the_stack(stack: StackAddresses) -> None:
    """The attack itself: `nobody` tries every way in that the modes above are meant to close."""
    done = subprocess.run(["/usr/bin/setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
                           "/usr/bin/python3", "-I", "-c", _AS_ANOTHER_USER, str(state_dir(stack)),
                           str(postgres_socket(stack))], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    results = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert results == {k: "PermissionError" for k in ("list-state", "read-history", "read-wal", "read-log",
                                                       "list-pgdata", "postgres-socket")}, results


def test_state_files_are_written_0600_even_over_old_0644_ones(tmp_path: Path) -> None:
    stack = LocalStack(tmp_path)
    stack.addresses = StackAddresses("127.0.0.1:7233", "postgresql://x@/y", None)
    path = tmp_path / "stack.json"
    path.write_text("{}")
    path.chmod(0o644)
    stack.write_stack_file(path)
    assert mode(path) == 0o600 and json.loads(path.read_text())["temporal_address"] == "127.0.0.1:7233"
    link = tmp_path / "planted.log"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):  # O_NOFOLLOW: a planted link is not written through
        private_file(link, append=True)
    assert not (tmp_path / "elsewhere").exists()
