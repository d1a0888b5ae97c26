"""The sandboxes: `BubblewrapSandbox`, the opt-in `UnsandboxedRunner`, and `get_sandbox` to pick one."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from pathlib import Path

from gymflow.environments.sandbox.cgroups import RunCgroup
from gymflow.environments.sandbox.cgroups import probe as cgroups_probe
from gymflow.environments.sandbox.contract import Sandbox, _as_bytes
from gymflow.environments.sandbox.seccomp_filter import filter_fd, seccomp_unavailable
from gymflow.environments.sandbox.types import (
    _BOOTSTRAP,
    _ENV,
    _ETC_FILES,
    _MERGED_USR,
    MISSING_BWRAP,
    NOBODY,
    PYTHON_ENV,
    UNSAFE_ENV,
    WORKDIR,
    Limits,
    SandboxStatus,
    SandboxUnavailable,
    _Staged,
)

log = logging.getLogger(__name__)
_SETPRIV_OK = os.access("/usr/bin/setpriv", os.X_OK)  # util-linux, like prlimit

class BubblewrapSandbox(Sandbox):
    """See the package docstring. `python` defaults to $GYMFLOW_SANDBOX_PYTHON, else /usr/bin/python3 (the
    system interpreter is readable by `nobody`; the worker's own may live under a private home), else
    sys.executable. `ro_binds` adds host paths (e.g. a venv with numpy), visible read-only at the same path.
    `run_as_uid` applies when we are root (default `nobody`)."""

    isolated = True
    _signal_exit_base = 128
    _reports_init = True

    def __init__(self, *, python: str | None = None, ro_binds: Sequence[str] = (), run_as_uid: int | None = None,
                 bwrap: str | None = None, cgroups: bool = True) -> None:
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
        reason = seccomp_unavailable()
        if reason:  # fail closed: no syscall filter, no sandbox
            raise SandboxUnavailable(reason)
        # Whole-sandbox memory and task caps; the root-to-uid drop then happens in the cgroup shim (setpriv).
        support = cgroups_probe().support if cgroups else None
        self.cgroups = support if support is None or self.run_as_uid is None or _SETPRIV_OK else None
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

    @contextlib.asynccontextmanager
    async def _confine(self, limits: Limits) -> AsyncIterator[RunCgroup | None]:
        if self.cgroups is None:
            yield None
            return
        try:
            cgroup = RunCgroup(self.cgroups, limits.memory_bytes, limits.max_procs)
        except OSError as err:
            raise SandboxUnavailable(f"cannot create the sandbox's cgroup ({self.cgroups.describe()}): {err}") from err
        try:
            yield cgroup
        finally:
            await cgroup.remove()

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
            seccomp = filter_fd()
            fds.append(seccomp)
            yield _Staged(cwd=None, fds=tuple(fds[:-1]), names=tuple(contents), extra_fds=(seccomp,))
        finally:
            for fd in fds:
                os.close(fd)

    def _argv(self, staged: _Staged, limits: Limits, ready_fd: int, info_fd: int) -> list[str]:
        size = ["--size", str(limits.tmpfs_bytes)] if self._sized_tmpfs else []
        data = [a for fd, name in zip(staged.fds, staged.names, strict=True)
                for a in ("--ro-bind-data", str(fd), f"{WORKDIR}/{name}")]
        env = [a for k, v in {**_ENV, "HOME": WORKDIR, "TMPDIR": "/tmp"}.items() for a in ("--setenv", k, v)]
        # Every writable mount is a size-capped tmpfs: /tmp, the working dir and /dev/shm. --dev's own
        # tmpfs cannot be sized, so /dev goes read-only (its device nodes stay usable).
        return [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--info-fd", str(info_fd),
                "--hostname", "sandbox", "--seccomp", str(staged.extra_fds[0]),
                "--clearenv", *env, *self._layout, "--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm",
                "--remount-ro", "/dev",
                *size, "--tmpfs", "/tmp", *size, "--tmpfs", WORKDIR, *data, "--chdir", WORKDIR, "--remount-ro", "/",
                "--", self.prlimit, *_prlimit_args(limits, nproc=self.cgroups is None), "--",
                self.python, "-I", "-B", "-c", _BOOTSTRAP, str(ready_fd), str(limits.thread_stack_bytes), "1"]

    def _env(self, staged: _Staged) -> dict[str, str] | None:
        # bwrap's own environment, not the program's (that is --clearenv/--setenv). It must be empty: bwrap
        # forks the pid namespace's init from itself, and its /proc/1/environ is readable from inside. An
        # inherited environment there handed the worker's API keys and DATABASE_URL to any program.
        return {}

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
        return [*rl, self.python, "-I", "-B", "-c", _BOOTSTRAP, str(ready_fd), str(limits.thread_stack_bytes), "0"]

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


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
