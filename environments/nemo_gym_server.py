"""Managed NeMo Gym resources servers: one process per (server, config, overrides) per env worker process.

Started on first use from NeMo Gym's Python (environments/nemo_gym_catalogue.py) through
environments/nemo_gym_launch.py, on a free port of 127.0.0.1, and health-checked (GET /health) within
START_TIMEOUT_S. A server found dead is restarted (at most MAX_RESTARTS in RESTART_WINDOW_S): each start has a new
`instance` id, and an episode seeded on an earlier instance has lost its session (the caller fails or masks it,
never scores it). Each server runs in a session of its own (its group is killed at stop) and dies with this
process (PR_SET_PDEATHSIG, set by the launcher); `stop_all` runs at exit.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from gymflow.environments import nemo_gym_catalogue as catalogue

from gymflow.kernel.errors import ConfigError, GymflowError
from gymflow.kernel.failures import ENVIRONMENT_ERROR

START_TIMEOUT_ENV = "GYMFLOW_NEMO_GYM_START_TIMEOUT_S"
START_TIMEOUT_S = 90.0  # a cold import of NeMo Gym plus a server's own packages on a loaded 2-core box
PORT_TRIES = 3  # a port taken between choosing it and the server binding it: choose again
MAX_RESTARTS = 3
RESTART_WINDOW_S = 600.0
STOP_GRACE_S = 5.0
LAUNCHER = Path(__file__).with_name("nemo_gym_launch.py")
SANDBOX_PROVIDER = "gymflow"  # environments/nemo_gym_sandbox_provider.py, registered by the launcher
_LOG_TAIL_CHARS = 1500
_SECRETISH = re.compile(r"(?i)((?:api[_-]?key|token|secret|password)\W{0,3}\s*[:=]\s*)\S+")


class ServerCrashed(GymflowError):
    """The server died more often than MAX_RESTARTS allows: a bug or a resource limit, not a blip."""

    failure_type = ENVIRONMENT_ERROR


@dataclass(frozen=True)
class Spec:
    server: str
    config: Path
    overrides: str = "{}"  # canonical JSON: equal overrides share one process

    @classmethod
    def of(cls, server: str, config: str | None, overrides: dict[str, Any] | None) -> Spec:
        info = catalogue.server(server)
        if config is None:
            path = catalogue.default_config(info) if info.configs else None
        elif config in info.configs:
            path = info.folder / "configs" / config
        else:
            raise ConfigError(f"resources_server_config: {config!r} is not a config of {server} "
                              f"(its configs: {', '.join(info.configs) or 'none'})")
        if path is None:
            raise ConfigError(f"NeMo Gym server {server} has no config file under {info.folder / 'configs'}")
        overrides = dict(overrides or {})
        if "sandbox_provider" not in overrides and catalogue.sandbox_in_place(info, path):
            # NeMo Gym's providers need a service or images this machine lacks: gymflow's sandbox stands in.
            overrides["sandbox_provider"] = _stand_in()
        return cls(server, path, json.dumps(overrides, sort_keys=True, separators=(",", ":")))

    def given_overrides(self) -> dict[str, Any]:
        """The overrides the row gave (without the sandbox gymflow put in place of the config's)."""
        overrides = json.loads(self.overrides)
        if overrides.get("sandbox_provider") == _stand_in():
            del overrides["sandbox_provider"]
        return overrides


def _stand_in() -> dict[str, Any]:
    return {SANDBOX_PROVIDER: {"python": sys.executable}}


def _free_port() -> int:
    """A port free now on 127.0.0.1 (a race with another process is handled by retrying on another)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _start_timeout() -> float:
    raw = os.environ.get(START_TIMEOUT_ENV) or START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"${START_TIMEOUT_ENV}: expected seconds, got {raw!r}") from None
    if not 0 < value <= 600:
        raise ConfigError(f"${START_TIMEOUT_ENV}: expected 0 < seconds <= 600, got {value:g}")
    return value


def _fix_for(server: str, tail: str, folder: Path, py: Path) -> str:
    """What the user does about a server that would not start, read off its log."""
    missing = re.findall(r"No module named '([^']+)'", tail)
    if missing:
        return (f"module {missing[-1]!r} is missing in NeMo Gym's venv: {py.parent / 'pip'} install -r "
                f"{folder / 'requirements.txt'}")
    if "config error" in tail:
        return "fix the config value named above (the row's resources_server_overrides, or its config file)"
    if re.search(r"(?i)address already in use|errno 98", tail):
        return "a port was taken each time; free some ports or retry"
    return f"run it by hand to see why: cd {folder} && {py} app.py"


class ManagedServer:
    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.instance = ""
        self.log = Path(tempfile.mkdtemp(prefix=f"gymflow-nemo-gym-{spec.server}-")) / "server.log"
        self._starts = 0
        self._deaths: collections.deque[float] = collections.deque()
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = \
            weakref.WeakKeyDictionary()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            text = self.log.read_text(errors="replace")[-_LOG_TAIL_CHARS:]
        except OSError:
            return ""
        return _SECRETISH.sub(r"\1<redacted>", text)

    async def ensure(self) -> tuple[str, str]:
        """(base URL, instance id) of a running server: started, or restarted when it died."""
        if self.alive() and self.instance:
            return self.url, self.instance
        lock = self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())
        async with lock:
            if self.alive() and self.instance:
                return self.url, self.instance
            if self.proc is not None:  # it ran and died: a crash
                now = time.monotonic()
                self._deaths.append(now)
                while self._deaths and now - self._deaths[0] > RESTART_WINDOW_S:
                    self._deaths.popleft()
                code, self.proc, self.instance = self.proc.returncode, None, ""
                if len(self._deaths) > MAX_RESTARTS:
                    raise ServerCrashed(f"NeMo Gym server {self.spec.server} died {len(self._deaths)} times in "
                                        f"{RESTART_WINDOW_S:g} s (last exit code {code}); not restarting it. Its log "
                                        f"({self.log}) ends: {' '.join(self.log_tail().split()[-40:])}")
            await self._start()
            return self.url, self.instance

    async def _start(self) -> None:
        py = catalogue.python()
        info = catalogue.server(self.spec.server)
        if refusal := catalogue.refusal_for(info, self.spec.given_overrides()):
            raise ConfigError(f"NeMo Gym server {self.spec.server} cannot run here: {refusal}")
        deadline = time.monotonic() + _start_timeout()
        why = ""
        for _ in range(PORT_TRIES):
            port = _free_port()
            self._spawn(py, info.folder, port)
            why = await self._wait_healthy(port, deadline)
            if not why:
                self._starts += 1
                # A new id per start, unique across workers: a session seeded elsewhere is not on this one.
                self.url, self.instance = f"http://127.0.0.1:{port}", uuid.uuid4().hex[:16]
                return
            self._kill()
            if not re.search(r"(?i)address already in use|errno 98", self.log_tail()):
                break
        tail = self.log_tail()
        raise ConfigError(f"NeMo Gym server {self.spec.server} did not start ({why}); fix: "
                          f"{_fix_for(self.spec.server, tail, info.folder, py)}; its log ({self.log}) ends: "
                          f"{' '.join(tail.split()[-40:])}")

    def _spawn(self, py: Path, folder: Path, port: int) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(py), str(LAUNCHER), str(folder), str(self.spec.config), self.spec.server, str(port),
                 str(os.getpid()), self.spec.overrides],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})

    async def _wait_healthy(self, port: int, deadline: float) -> str:
        """'' once GET /health answers 200; else why not (it exited, or the deadline passed)."""
        assert self.proc is not None
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
            while True:
                if self.proc.poll() is not None:
                    return f"it exited with code {self.proc.returncode}"
                try:
                    if (await client.get(f"http://127.0.0.1:{port}/health")).status_code == 200:
                        return ""
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    return f"no answer on /health within {_start_timeout():g} s (${START_TIMEOUT_ENV})"
                await asyncio.sleep(0.2)

    def _kill(self) -> None:
        proc, self.proc, self.instance = self.proc, None, ""
        if proc is None or proc.poll() is not None:
            return
        # start_new_session made it a group leader: the group is the server and whatever it started.
        for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, STOP_GRACE_S)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def stop(self) -> None:
        self._kill()


_SERVERS: dict[Spec, ManagedServer] = {}


def managed(spec: Spec) -> ManagedServer:
    """This process's server for `spec` (created, not started)."""
    if spec not in _SERVERS:
        _SERVERS[spec] = ManagedServer(spec)
    return _SERVERS[spec]


def stop_all() -> None:
    for srv in list(_SERVERS.values()):
        srv.stop()
    _SERVERS.clear()


atexit.register(stop_all)
