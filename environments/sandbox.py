"""Run untrusted Python (model-written code) in a sandbox: the contract and a bubblewrap implementation.

Contract: `await sandbox.run_python(source, stdin, files=..., limits=...) -> SandboxResult`. The source runs
as `main.py` in a private working directory next to `files`; the result carries a typed `status`
(ok / timeout / memory / output_limit / killed / error), the exit code, stdout (capped) and stderr (tail).

`BubblewrapSandbox` (Debian package `bubblewrap`):
- `--unshare-all`: new user, pid, net, ipc, uts and cgroup namespaces. No network, not even the host's
  loopback; the whole process tree dies with the pid namespace.
- A fresh root with read-only binds of /usr (plus the merged-usr links and the loader's files in /etc)
  and the interpreter's prefix. Nothing else of the host is visible (homes, /var, /work, the host's
  /tmp). /tmp and the working dir /sandbox are private, size-capped tmpfs; "/" is remounted read-only.
- `--die-with-parent`, `--new-session` (no TIOCSTI into our terminal), `--clearenv`.
- rlimits set inside by `prlimit` (util-linux): CPU, address space, processes, file size, open
  files, no core dumps. Not `preexec_fn`: that is unsafe in threaded processes (Temporal workers).
- When we run as root the sandbox runs as `nobody` (65534): the kernel never applies RLIMIT_NPROC to
  uid 0, so a fork bomb would otherwise only be stopped by the wall clock.
- stdout and stderr are read incrementally; past `output_bytes` the sandbox is killed. A wall-clock
  timeout kills the process group (bwrap), and `--die-with-parent` takes the namespace down with it.

Unsandboxed mode (`UnsandboxedRunner`) keeps the rlimits (minus the process limit), the output cap and
the timeout but isolates nothing: the code can read and write your files and use the network. It is
used only when bwrap is missing and the caller opted in, with `get_sandbox(allow_unsandboxed=True)` or
`GYMFLOW_UNSAFE_NO_SANDBOX=1`. Never enable it on a machine with anything worth protecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from gymflow.kernel.errors import GymflowError

log = logging.getLogger(__name__)

UNSAFE_ENV = "GYMFLOW_UNSAFE_NO_SANDBOX"
PYTHON_ENV = "GYMFLOW_SANDBOX_PYTHON"
NOBODY = 65534
WORKDIR = "/sandbox"
_CHUNK = 1 << 16
_MIB = 1 << 20
_MEMORY_MARKERS = (b"MemoryError", b"Cannot allocate memory")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# Runs first inside the sandbox: reports "the interpreter started" on a pipe (so a sandbox that failed
# to set up is told apart from a program that failed), drops every inherited fd, then runs main.py.
_BOOTSTRAP = (
    "import os, runpy, sys\n"
    "os.write(int(sys.argv[1]), b'1')\n"
    "os.closerange(3, 65536)\n"
    "sys.argv = ['main.py']\n"
    "runpy.run_path('main.py', run_name='__main__')\n"
)

MISSING_BWRAP = (
    "bubblewrap (`bwrap`) is not on PATH: model-written code is only run inside it. Install the Debian/Ubuntu "
    f"package `bubblewrap` (apt-get install bubblewrap), or set {UNSAFE_ENV}=1 to run such code without any "
    "isolation (it can then read and write your files and use the network)."
)


class SandboxUnavailable(GymflowError):
    """No sandbox can run here (bwrap missing or unable to create namespaces)."""

    failure_type = "sandbox_unavailable"


class SandboxStatus(StrEnum):
    OK = "ok"  # the program ended by itself (any exit code)
    TIMEOUT = "timeout"  # wall clock or CPU time
    MEMORY = "memory"  # allocation failed under the address-space limit
    OUTPUT_LIMIT = "output_limit"  # stdout/stderr over the cap, or a file over the size limit
    KILLED = "killed"  # ended by a signal we did not send (segfault, abort, OOM killer)
    ERROR = "error"  # the sandbox itself failed; says nothing about the program


@dataclass(frozen=True)
class Limits:
    wall_s: float = 10.0
    cpu_s: int = 10
    memory_bytes: int = 1 << 30  # RLIMIT_AS, per process
    max_procs: int = 16  # RLIMIT_NPROC, counted per sandbox (its own user namespace)
    file_bytes: int = 16 * _MIB  # RLIMIT_FSIZE
    output_bytes: int = 16 * _MIB  # stdout kept up to this; either stream past it kills the run
    stderr_bytes: int = 16 * 1024  # tail of stderr kept
    tmpfs_bytes: int = 64 * _MIB  # size of /tmp and of the working dir, each
    open_files: int = 256
    stack_bytes: int | None = None  # RLIMIT_STACK; None keeps the inherited one


@dataclass(frozen=True)
class SandboxResult:
    status: SandboxStatus
    exit_code: int | None  # None when ended by a signal
    stdout: str
    stderr: str
    wall_s: float
    signal: int | None = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False

    @property
    def succeeded(self) -> bool:
        return self.status is SandboxStatus.OK and self.exit_code == 0


@dataclass
class _Run:
    returncode: int | None
    stdout: bytes
    stdout_truncated: bool
    stderr: bytes
    stderr_truncated: bool
    stopped: SandboxStatus | None  # why we killed it; None when it ended by itself
    started: bool
    wall_s: float


@dataclass
class _Staged:
    cwd: str | None
    fds: tuple[int, ...]
    names: tuple[str, ...]


class Sandbox(ABC):
    isolated: ClassVar[bool]
    # bwrap reports a child killed by signal N as exit code 128 + N; a plain child shows -N.
    _signal_exit_base: ClassVar[int | None] = None
    # bwrap writes the host pid of its pid namespace's init to --info-fd: killing it ends the namespace.
    _reports_init: ClassVar[bool] = False

    async def check(self) -> None:  # noqa: B027 - optional hook: most sandboxes have nothing to check
        """Raise `SandboxUnavailable` when this sandbox cannot run programs here."""

    async def run_python(self, source: str, stdin: bytes | str = b"", *, files: Mapping[str, bytes | str] | None = None,
                         limits: Limits | None = None) -> SandboxResult:
        """Run `source` as main.py with `files` beside it in the working dir, feeding `stdin`."""
        limits = limits or Limits()
        contents = {"main.py": source, **(files or {})}
        _check_names(contents)
        with self._stage(contents) as staged:
            chan = _Channels.open()
            try:
                argv = self._argv(staged, limits, chan.ready_w, chan.info_w)
            except BaseException:
                chan.close_all()
                raise
            spawn = _Spawn(argv, pass_fds=(chan.ready_w, chan.info_w, *staged.fds), cwd=staged.cwd,
                           env=self._env(staged), user=self._user())
            run = await _shielded(spawn, _as_bytes(stdin), limits, chan, reports_init=self._reports_init)
        return _classify(run, self._signal_exit_base)

    @abstractmethod
    def _stage(self, contents: Mapping[str, bytes | str]) -> contextlib.AbstractContextManager[_Staged]:
        """Make `contents` available to the child (fds or a directory)."""

    @abstractmethod
    def _argv(self, staged: _Staged, limits: Limits, ready_fd: int, info_fd: int) -> list[str]: ...

    def _env(self, staged: _Staged) -> dict[str, str] | None:
        return None

    def _user(self) -> int | None:
        return None


class BubblewrapSandbox(Sandbox):
    """See the module docstring. `python` defaults to $GYMFLOW_SANDBOX_PYTHON, else /usr/bin/python3 (the
    system interpreter is readable by `nobody`; the worker's own may live under a private home), else
    sys.executable. `ro_binds` adds host paths (e.g. a venv with numpy), visible read-only at the same path.
    `run_as_uid` applies when we are root (default `nobody`)."""

    isolated = True
    _signal_exit_base = 128
    _reports_init = True

    def __init__(self, *, python: str | None = None, ro_binds: Sequence[str] = (), run_as_uid: int | None = None,
                 bwrap: str | None = None) -> None:
        found = bwrap or shutil.which("bwrap")
        if not found:
            raise SandboxUnavailable(MISSING_BWRAP)
        prlimit = os.path.realpath(shutil.which("prlimit") or "/nonexistent")  # /bin/prlimit -> /usr/bin/prlimit
        if not prlimit.startswith("/usr/") or not os.access(prlimit, os.X_OK):
            raise SandboxUnavailable("prlimit (Debian package util-linux) is needed under /usr to set rlimits")
        self.bwrap, self.prlimit = found, prlimit
        self.python = _absolute(python or default_python())
        self.run_as_uid = (NOBODY if run_as_uid is None else run_as_uid) if os.geteuid() == 0 else None
        self._layout = _root_layout(self.python, ro_binds)
        self._sized_tmpfs = "--size" in _bwrap_help(found)  # --size arrived in bwrap 0.7
        self._checked = False

    async def check(self) -> None:
        if self._checked:
            return
        result = await self.run_python("print('ok')", limits=Limits(wall_s=20, cpu_s=10))
        if result.status is not SandboxStatus.OK or result.stdout != "ok\n":
            who = f"uid {self.run_as_uid}" if self.run_as_uid is not None else "this user"
            raise SandboxUnavailable(
                f"bubblewrap cannot run {self.python} as {who} ({result.status}, exit {result.exit_code}): "
                f"{result.stderr.strip()[-500:]}. Likely causes: user namespaces disabled for unprivileged users "
                "(sysctl kernel.unprivileged_userns_clone, kernel.apparmor_restrict_unprivileged_userns, a "
                f"container's seccomp profile), or an interpreter that user cannot read (set {PYTHON_ENV}).")
        self._checked = True

    @contextlib.contextmanager
    def _stage(self, contents: Mapping[str, bytes | str]) -> Iterator[_Staged]:
        # memfds: bwrap copies them into the sandbox's tmpfs; nothing is written to the host's disk.
        fds: list[int] = []
        try:
            for name, data in contents.items():
                fd = os.memfd_create(f"gymflow-{name}", os.MFD_CLOEXEC)
                fds.append(fd)
                _write_all(fd, _as_bytes(data))
                os.lseek(fd, 0, os.SEEK_SET)
            yield _Staged(cwd=None, fds=tuple(fds), names=tuple(contents))
        finally:
            for fd in fds:
                os.close(fd)

    def _argv(self, staged: _Staged, limits: Limits, ready_fd: int, info_fd: int) -> list[str]:
        size = ["--size", str(limits.tmpfs_bytes)] if self._sized_tmpfs else []
        data = [a for fd, name in zip(staged.fds, staged.names, strict=True)
                for a in ("--ro-bind-data", str(fd), f"{WORKDIR}/{name}")]
        env = [a for k, v in {**_ENV, "HOME": WORKDIR, "TMPDIR": "/tmp"}.items() for a in ("--setenv", k, v)]
        return [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
                "--hostname", "sandbox",
                "--clearenv", *env, *self._layout, "--proc", "/proc", "--dev", "/dev",
                *size, "--tmpfs", "/tmp", *size, "--tmpfs", WORKDIR, *data, "--chdir", WORKDIR, "--remount-ro", "/",
                "--", self.prlimit, *_prlimit_args(limits, nproc=True), "--",
                self.python, "-I", "-B", "-c", _BOOTSTRAP, str(ready_fd)]

    def _user(self) -> int | None:
        return self.run_as_uid


class UnsandboxedRunner(Sandbox):
    """NO ISOLATION: a plain child process with rlimits, the output cap and the timeout. Opt-in only."""

    isolated = False

    def __init__(self, *, python: str | None = None) -> None:
        self.python = python or sys.executable
        self.prlimit = shutil.which("prlimit")

    @contextlib.contextmanager
    def _stage(self, contents: Mapping[str, bytes | str]) -> Iterator[_Staged]:
        with tempfile.TemporaryDirectory(prefix="gymflow-unsafe-") as tmp:
            for name, data in contents.items():
                Path(tmp, name).write_bytes(_as_bytes(data))
            yield _Staged(cwd=tmp, fds=(), names=tuple(contents))

    def _argv(self, staged: _Staged, limits: Limits, ready_fd: int, info_fd: int) -> list[str]:
        # No RLIMIT_NPROC here: outside a user namespace it counts every process of this user.
        rl = [self.prlimit, *_prlimit_args(limits, nproc=False), "--"] if self.prlimit else []
        return [*rl, self.python, "-I", "-B", "-c", _BOOTSTRAP, str(ready_fd)]

    def _env(self, staged: _Staged) -> dict[str, str] | None:
        return {**_ENV, "HOME": staged.cwd or "/", "TMPDIR": staged.cwd or "/tmp"}


def get_sandbox(*, allow_unsandboxed: bool | None = None) -> Sandbox:
    """bwrap when installed; else the unsandboxed runner if the caller (or $GYMFLOW_UNSAFE_NO_SANDBOX=1) opted in."""
    if shutil.which("bwrap"):
        return BubblewrapSandbox()
    if allow_unsandboxed is None:
        allow_unsandboxed = os.environ.get(UNSAFE_ENV, "") == "1"
    if allow_unsandboxed:
        log.warning("bwrap not found; running model code WITHOUT a sandbox (%s=1)", UNSAFE_ENV)
        return UnsandboxedRunner()
    raise SandboxUnavailable(MISSING_BWRAP)


def default_python() -> str:
    explicit = os.environ.get(PYTHON_ENV)
    if explicit:
        return explicit
    return "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable


# ---- execution ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Spawn:
    argv: list[str]
    pass_fds: tuple[int, ...]
    cwd: str | None
    env: dict[str, str] | None
    user: int | None


@dataclass
class _Channels:
    """Pipes from the child: `ready` (the interpreter started) and `info` (bwrap's namespace init pid)."""

    ready_r: int
    ready_w: int
    info_r: int
    info_w: int

    @classmethod
    def open(cls) -> _Channels:
        ready_r, ready_w = os.pipe()
        info_r, info_w = os.pipe()
        return cls(ready_r, ready_w, info_r, info_w)

    def close_write_ends(self) -> None:
        for fd in (self.ready_w, self.info_w):
            os.close(fd)

    def close_all(self) -> None:
        self.close_write_ends()
        for fd in (self.ready_r, self.info_r):
            os.close(fd)


async def _shielded(spawn: _Spawn, stdin: bytes, limits: Limits, chan: _Channels, *, reports_init: bool) -> _Run:
    # Cancellation must not interrupt a run half-way (a child spawned but never killed): it becomes a stop
    # request, and we wait for the clean-up before re-raising.
    stop = asyncio.Event()
    job = asyncio.ensure_future(_execute(spawn, stdin, limits, chan, stop, reports_init=reports_init))
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        stop.set()
        with contextlib.suppress(BaseException):
            await job
        raise


async def _execute(spawn: _Spawn, stdin: bytes, limits: Limits, chan: _Channels, stop: asyncio.Event, *,
                   reports_init: bool) -> _Run:
    """Spawn, feed, drain and bound one child. Owns (and closes) the channels."""
    extra: dict[str, Any] = {}
    if spawn.user is not None:
        extra = {"user": spawn.user, "group": spawn.user, "extra_groups": []}
    try:
        start = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *spawn.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, pass_fds=spawn.pass_fds, start_new_session=True, cwd=spawn.cwd,
                env=spawn.env, **extra)
        finally:
            chan.close_write_ends()  # the child has its own copies
        assert proc.stdin and proc.stdout and proc.stderr
        over = asyncio.Event()
        feeder = asyncio.create_task(_feed(proc.stdin, stdin))
        out = asyncio.create_task(_drain(proc.stdout, limits.output_bytes, limits.output_bytes, over, keep_tail=False))
        err = asyncio.create_task(_drain(proc.stderr, limits.stderr_bytes, limits.output_bytes, over, keep_tail=True))
        try:
            stopped = await _wait(proc, over, stop, limits.wall_s)
        finally:
            if proc.returncode is None:
                await _stop(proc, chan.info_r if reports_init else None)
            _kill_group(proc)  # the unsandboxed runner's stragglers
            await proc.wait()
            wall = time.monotonic() - start
            (stdout, out_cut), (stderr, err_cut) = await _collect(out, err, feeder)
        return _Run(proc.returncode, stdout, out_cut, stderr, err_cut, stopped, _started(chan.ready_r), wall)
    finally:
        os.close(chan.ready_r)
        os.close(chan.info_r)


async def _wait(proc: asyncio.subprocess.Process, over: asyncio.Event, stop: asyncio.Event,
                wall_s: float) -> SandboxStatus | None:
    exited = asyncio.create_task(proc.wait())
    overflow = asyncio.create_task(over.wait())
    stopping = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait({exited, overflow, stopping}, timeout=wall_s,
                                     return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (exited, overflow, stopping):
            task.cancel()
    if exited in done:
        return None
    if overflow in done:
        return SandboxStatus.OUTPUT_LIMIT
    return SandboxStatus.KILLED if stopping in done else SandboxStatus.TIMEOUT


async def _stop(proc: asyncio.subprocess.Process, info_r: int | None) -> None:
    """Kill a running child. Under bwrap, kill its pid namespace's init first: that ends every process in
    the namespace at once, whereas the init may not have armed --die-with-parent yet (a child stopped
    right after its start) and --new-session took it out of our process group."""
    if info_r is not None:
        init = await _namespace_init(proc, info_r)
        if init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
    _kill_group(proc)


async def _namespace_init(proc: asyncio.subprocess.Process, info_r: int, wait_s: float = 5.0) -> int | None:
    # bwrap writes --info-fd right after creating the namespace; until then there is nothing to kill inside.
    os.set_blocking(info_r, False)
    data, deadline = b"", time.monotonic() + wait_s
    while proc.returncode is None and time.monotonic() < deadline:
        try:
            chunk = os.read(info_r, 4096)
        except BlockingIOError:
            await asyncio.sleep(0.005)
            continue
        if not chunk:
            return None
        data += chunk
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return int(json.loads(data)["child-pid"])
    return None


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    # start_new_session made the child a group leader, so its pid is the group id.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    # A program may exit without reading its input: a broken pipe is not our error. Close even when
    # cancelled, or a reader in the sandbox would wait for EOF for ever.
    try:
        with contextlib.suppress(OSError):
            if data:
                writer.write(data)
                await writer.drain()
    finally:
        writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def _drain(reader: asyncio.StreamReader, keep: int, cap: int, over: asyncio.Event, *,
                 keep_tail: bool) -> tuple[bytes, bool]:
    """Read a stream to EOF keeping `keep` bytes (head or tail); past `cap` bytes set `over`."""
    buf, total = bytearray(), 0
    while chunk := await reader.read(_CHUNK):
        total += len(chunk)
        if total > cap:
            over.set()
        if keep_tail:
            buf += chunk
            if len(buf) > 2 * keep:
                del buf[:-keep]
        elif len(buf) < keep:
            buf += chunk[: keep - len(buf)]
    if keep_tail and len(buf) > keep:
        del buf[:-keep]
    return bytes(buf), total > keep


async def _collect(out: asyncio.Task[tuple[bytes, bool]], err: asyncio.Task[tuple[bytes, bool]],
                   feeder: asyncio.Task[None]) -> tuple[tuple[bytes, bool], tuple[bytes, bool]]:
    # Everything in the sandbox is dead by now, so EOF is immediate; the timeout guards the unsandboxed case.
    done, pending = await asyncio.wait({out, err, feeder}, timeout=2.0)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    empty = (b"", False)
    return (out.result() if out in done else empty), (err.result() if err in done else empty)


def _started(ready_r: int) -> bool:
    os.set_blocking(ready_r, False)
    try:
        return os.read(ready_r, 1) == b"1"
    except BlockingIOError:
        return False


def _classify(run: _Run, signal_exit_base: int | None) -> SandboxResult:
    code, sig = run.returncode, None
    if code is not None and code < 0:
        code, sig = None, -code
    elif code is not None and signal_exit_base is not None and signal_exit_base < code <= signal_exit_base + 64:
        code, sig = None, code - signal_exit_base
    return SandboxResult(status=_status(run, code, sig), exit_code=code, stdout=run.stdout.decode("utf-8", "replace"),
                         stderr=run.stderr.decode("utf-8", "replace"), wall_s=round(run.wall_s, 4), signal=sig,
                         stdout_truncated=run.stdout_truncated, stderr_truncated=run.stderr_truncated)


def _status(run: _Run, code: int | None, sig: int | None) -> SandboxStatus:
    if not run.started:
        return SandboxStatus.ERROR
    if run.stopped is not None:
        return run.stopped
    if sig == signal.SIGXCPU:
        return SandboxStatus.TIMEOUT
    if sig == signal.SIGXFSZ:
        return SandboxStatus.OUTPUT_LIMIT
    if code != 0 and any(m in run.stderr for m in _MEMORY_MARKERS):
        return SandboxStatus.MEMORY
    return SandboxStatus.KILLED if sig is not None else SandboxStatus.OK


# ---- helpers -----------------------------------------------------------------------------------


def _prlimit_args(limits: Limits, *, nproc: bool) -> list[str]:
    def pair(name: str, value: int) -> str:
        return f"--{name}={value}:{value}"

    args = [f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}",  # SIGXCPU at the soft limit, SIGKILL a second later
            pair("as", limits.memory_bytes), pair("fsize", limits.file_bytes), pair("nofile", limits.open_files),
            pair("core", 0)]
    if nproc:
        args.append(pair("nproc", limits.max_procs))
    if limits.stack_bytes is not None:
        args.append(pair("stack", limits.stack_bytes))
    return args


def _root_layout(python: str, extra: Sequence[str]) -> list[str]:
    args = ["--ro-bind", "/usr", "/usr"]
    for name in _MERGED_USR:
        path = Path(name)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), name]
        elif path.is_dir():
            args += ["--ro-bind", name, name]
    for name in _ETC_FILES:
        args += ["--ro-bind-try", name, name]
    for path in [*_interpreter_dirs(python), *extra]:
        args += ["--ro-bind", path, path]
    return args


def _interpreter_dirs(python: str) -> list[str]:
    """The prefixes an interpreter outside /usr needs: its venv and the real installation behind it."""
    exe = Path(python).absolute()
    dirs = {str(exe.parent.parent), str(exe.resolve().parent.parent)}
    return sorted(d for d in dirs if d != "/" and not (d + "/").startswith("/usr/"))


def _absolute(program: str) -> str:
    if os.path.isabs(program):
        return program
    found = shutil.which(program)
    if not found:
        raise SandboxUnavailable(f"sandbox interpreter {program!r} not found on PATH (set {PYTHON_ENV})")
    return found


def _bwrap_help(bwrap: str) -> str:
    try:
        done = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout + done.stderr


def _check_names(contents: Mapping[str, bytes | str]) -> None:
    for name in contents:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"sandbox file name {name!r}: a plain file name is required")


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else data


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
