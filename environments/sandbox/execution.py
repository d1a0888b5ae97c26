"""Async process execution: spawn the child, feed its stdin, drain its output under the caps, wait, kill, and
classify the outcome."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from gymflow.environments.sandbox.reaper import become_subreaper, reap_init
from gymflow.environments.sandbox.types import _CHUNK, _MEMORY_MARKERS, Limits, SandboxResult, SandboxStatus, _Run

_TEARDOWN_S = 10.0  # after the kill, how long the pipes may take to reach EOF

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
    if reports_init:
        become_subreaper()  # bwrap's init outlives bwrap: be the one it is handed to (see reaper.py)
    init: int | None = None
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
        out_sink, err_sink = _Sink(limits.output_bytes, tail=False), _Sink(limits.stderr_bytes, tail=True)
        feeder = asyncio.create_task(_feed(proc.stdin, stdin))
        out = asyncio.create_task(_drain(proc.stdout, out_sink, limits.output_bytes, over))
        err = asyncio.create_task(_drain(proc.stderr, err_sink, limits.output_bytes, over))
        try:
            stopped = await _wait(proc, over, stop, limits.wall_s)
        finally:
            if proc.returncode is None:
                init = await _stop(proc, chan.info_r if reports_init else None)
            _kill_group(proc)  # the unsandboxed runner's stragglers
            wall = time.monotonic() - start
            await _teardown(proc, out, err, feeder)
            if reports_init:
                await reap_init(init if init is not None else _read_init(chan.info_r))
        (stdout, out_cut), (stderr, err_cut) = out_sink.result(), err_sink.result()
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


async def _stop(proc: asyncio.subprocess.Process, info_r: int | None) -> int | None:
    """Kill a running child. Under bwrap, kill its pid namespace's init first: that ends every process in
    the namespace at once, whereas the init may not have armed --die-with-parent yet (a child stopped
    right after its start) and --new-session took it out of our process group. Returns the init's pid."""
    init = None
    if info_r is not None:
        init = await _namespace_init(proc, info_r)
        if init is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(init, signal.SIGKILL)
    _kill_group(proc)
    return init


def _read_init(info_r: int) -> int | None:
    """The init's pid from --info-fd once bwrap has exited (it wrote it at start, if it got that far)."""
    os.set_blocking(info_r, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(info_r, 4096):
            data += chunk
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return int(json.loads(data)["child-pid"])
    return None


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


@dataclass
class _Sink:
    """What was read of one stream so far: kept outside the reading task, so a cancelled read loses nothing."""

    keep: int
    tail: bool
    buf: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        if self.tail:
            self.buf += chunk
            if len(self.buf) > 2 * self.keep:
                del self.buf[:-self.keep]
        elif len(self.buf) < self.keep:
            self.buf += chunk[: self.keep - len(self.buf)]

    def result(self) -> tuple[bytes, bool]:
        data = self.buf[-self.keep:] if self.tail and len(self.buf) > self.keep else self.buf
        return bytes(data), self.total > self.keep


async def _drain(reader: asyncio.StreamReader, sink: _Sink, cap: int, over: asyncio.Event) -> None:
    """Read a stream to EOF into `sink`; past `cap` bytes set `over`."""
    while chunk := await reader.read(_CHUNK):
        sink.add(chunk)
        if sink.total > cap:
            over.set()


async def _teardown(proc: asyncio.subprocess.Process, *readers: asyncio.Task[None]) -> None:
    """Wait for the killed child and the end of its output, a realistic while, then keep what was read.
    asyncio's proc.wait() also waits for the pipes to close, and a dying process may hold them for some
    time (freeing a large address space, a full tmpfs); unsandboxed, an escaped one may hold them for ever."""
    exited = asyncio.ensure_future(proc.wait())
    _, pending = await asyncio.wait({exited, *readers}, timeout=_TEARDOWN_S)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


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
    if run.oom_killed:  # a child's death may leave the program itself exiting 0
        return SandboxStatus.MEMORY
    if sig == signal.SIGXCPU:
        return SandboxStatus.TIMEOUT
    if sig == signal.SIGXFSZ:
        return SandboxStatus.OUTPUT_LIMIT
    if code != 0 and any(m in run.stderr for m in _MEMORY_MARKERS):
        return SandboxStatus.MEMORY
    return SandboxStatus.KILLED if sig is not None else SandboxStatus.OK
