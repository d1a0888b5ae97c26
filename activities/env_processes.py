"""Supervised environment processes: environment code (setup, tool calls, verify) runs here, never on a worker's
event loop, so a model's input that makes it spin, sleep, allocate, print or exit costs one call, not a worker.

`EnvProcesses` owns N long-lived processes (activities/env_child.py), started by multiprocessing's forkserver (not
fork: the worker has Temporal's Rust threads; a forkserver fork costs a few ms where a spawn re-imports everything).
Each takes one call at a time over its own socketpair: an 8-byte length and a pickle each way; the parent waits with
`loop.sock_*`, no thread. A call's wall clock starts when a free, ready process takes it (time queued for a process,
starting one, or loading the environment into it does not count); at its limit the process is SIGKILLed, the call
ends typed, and a new process replaces it. The memory cap is RLIMIT_AS, set in the child per call.

Why this and not pebble (measured with bench/env_processes.py on a 2-core box, 10k trivial single_tool calls
per variant, two runs): this protocol costs 0.06-0.08 ms of the worker's CPU and 0.07-0.09 ms of the process's per
call, 0.13-0.14 ms p50 / 0.18-0.25 ms p95 round trip; pebble.ProcessPool costs 0.18-0.22 ms of the worker's CPU per
call (its helper threads hand each call over, contending for the GIL with the Temporal loop), 0.45 ms p50 /
0.56-0.60 ms p95. Both kill a worker on timeout; pebble's clock starts when its worker acknowledges the task, which
suits, but it costs the worker 2-3x per call and a tool call is the hottest environment step. So: a small protocol
of our own. A call's outcome:

- tool: over its time or memory limit, or its process died: a tool error for the model, state unchanged;
- verify: masked as `verifier_timeout` or `verifier_crashed`;
- setup (and loading the environment): `environment_error`, not retried (a `GymflowError`);
- an exception the environment raised is raised again in the worker (with the child's traceback as its cause), so
  the activity boundary classifies it exactly as an in-process one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import multiprocessing as mp
import os
import pickle
import socket
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gymflow.activities.env_calls import tool_error
from gymflow.activities.env_child import _TASKS_KEPT, HEADER, MAX_FRAME_BYTES, MAX_REPLY_BYTES, serve
from gymflow.activities.process_tree import kill_tree
from gymflow.environments.base import JSON, Environment, Step
from gymflow.environments.registry import entry_point_value

from gymflow.kernel.errors import ConfigError, GymflowError, VerifierError
from gymflow.kernel.failures import ENVIRONMENT_ERROR, VERIFIER_CRASHED, VERIFIER_TIMEOUT, short_message
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolCall, ToolResult, ToolSpec

log = logging.getLogger(__name__)

LOAD_TIMEOUT_S = 120.0  # importing an environment and its warm_up, before its first call's clock starts
START_TIMEOUT_S = 60.0  # a new process, up to its "ready"
QUEUE_TIMEOUT_S = 300.0  # waiting for a free process; then the activity fails retryably
_TASK_KEYS_KEPT = 1024
_WARM_KEPT = 4  # environments a new process loads before its first call (the most recently used)
PROCESSES_ENV = "GYMFLOW_ENV_PROCESSES"  # overrides the default process count
# A process busy on one call for longer than this is "held": a caller that finds every process busy then gets an
# extra one (up to OVERFLOW_FACTOR x the size), so hostile calls that run to their limit (spin, sleep, a hanging
# verifier) never queue the other rollouts' calls behind them. Extras retire once nobody waits.
HELD_S = 0.5
OVERFLOW_FACTOR = 4
# A call that needs a larger memory cap than its process may set (its hard limit is lowered per call, and raising it
# needs CAP_SYS_RESOURCE) goes to a fresh process; bounded.
RESPAWNS = 3


def default_size() -> int:
    """One process per core, at least 2 (a hostile call must not hold up every other), at most 8."""
    if os.environ.get(PROCESSES_ENV):
        return max(1, int(os.environ[PROCESSES_ENV]))
    return max(2, min(8, os.cpu_count() or 1))


MIN_MEMORY_MB = 64  # below it Python itself cannot start a call


@dataclass(frozen=True)
class Limits:
    """Per-call limits; the config's `environments.<name>.tool_timeout_s` / `verify_timeout_s` /
    `setup_timeout_s` / `memory_mb` override the defaults per environment."""

    tool_s: float = 10.0
    verify_s: float = 30.0
    setup_s: float = 30.0
    memory_mb: int = 1024

    @classmethod
    def from_options(cls, options: JSON) -> Limits:
        out = {}
        for key, field in (("tool_timeout_s", "tool_s"), ("verify_timeout_s", "verify_s"),
                           ("setup_timeout_s", "setup_s"), ("memory_mb", "memory_mb")):
            value = options.get(key)
            if value is None and key == "verify_timeout_s":
                value = options.get("library_timeout_s")  # math_with_judge's older name for it
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 86_400 * 1024:
                raise ConfigError(f"environments.*.{key}: expected a positive number, got {value!r}")
            if field == "memory_mb" and value < MIN_MEMORY_MB:  # 0.5 once became 0: no cap at all
                raise ConfigError(f"environments.*.memory_mb: at least {MIN_MEMORY_MB} (MB), got {value!r}")
            out[field] = int(value) if field == "memory_mb" else float(value)
        return cls(**out)


Kind = Literal["timeout", "memory", "crashed"]


class CallFailed(Exception):
    """The call's process overran its limit or died; the process has been replaced."""

    def __init__(self, kind: Kind, detail: str) -> None:
        super().__init__(detail)
        self.kind, self.detail = kind, detail

    def describe(self, what: str) -> str:
        return f"{what} {self.detail}"


class EnvProcessesClosed(RuntimeError):
    """The worker is shutting down: the activity fails retryably and runs again elsewhere."""


class EnvProcessesBusy(RuntimeError):
    """No process was free for QUEUE_TIMEOUT_S: the activity fails retryably."""


class RemoteError(Exception):
    """An exception from a supervised process that could not travel as itself: its class name and first line."""


class RemoteTraceback(Exception):
    """The traceback as the supervised process printed it (the cause of the exception raised again here)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)

    def __str__(self) -> str:
        return str(self.args[0])


class _Proc:
    def __init__(self, ctx: Any) -> None:
        self.sock, child = socket.socketpair()
        self.process = ctx.Process(target=serve, args=(child,), daemon=True, name="gymflow-env")
        self._child = child
        self.loaded: set[str] = set()
        self.tasks: OrderedDict[str, None] = OrderedDict()  # keys this process holds (a mirror of its LRU)
        self.expired = False
        self.reaped = False
        self.busy_since: float | None = None  # loop time its current call began; None while idle
        self.share: str | None = None  # whose call it serves (EnvProcesses fair share); None while idle

    def start(self) -> None:
        try:
            self.process.start()
        finally:
            self._child.close()
        self.sock.setblocking(False)

    def kill(self) -> None:
        try:
            # Only while it has not been reported dead: its pid may be reused once it has.
            if self.process.pid is not None and self.process.exitcode is None:
                kill_tree(self.process.pid)  # and whatever its call started (activities/process_tree.py)
        except ValueError:  # already reaped and closed
            pass
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # a pending read returns now, even if something else holds the peer
        except OSError:
            pass

    def alive(self) -> bool:
        try:
            return not self.reaped and self.process.is_alive()
        except ValueError:  # closed meanwhile
            return False

    def reap(self) -> None:
        """Collect the dead process (blocking, bounded: run off the loop). Idempotent."""
        if self.reaped:
            return
        self.reaped = True
        self.kill()
        try:
            self.process.join(5)
            self.process.close()
        except (ValueError, AssertionError):  # never started (join asserts), or closed already
            pass
        self.sock.close()


async def _recv_exact(loop: asyncio.AbstractEventLoop, sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


async def _recv(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> tuple[Any, ...] | None:
    head = await _recv_exact(loop, sock, HEADER.size)
    if head is None:
        return None
    (n,) = HEADER.unpack(head)
    if n > MAX_REPLY_BYTES:
        raise UnreadableReply(f"a reply of {n} bytes, over {MAX_REPLY_BYTES}")
    body = await _recv_exact(loop, sock, n)
    if body is None:
        return None
    try:
        return pickle.loads(body)
    except Exception as e:  # a class this worker lacks, a truncated or hostile pickle: the environment's failure
        why = f"{type(e).__name__}: {short_message(e, 120)}"
        raise UnreadableReply(f"a reply this worker cannot read ({why})") from None


class UnreadableReply(Exception):
    """A supervised process answered what the worker refuses to read: too large, or not unpicklable here."""


async def _exit_code(proc: _Proc, wait_s: float = 0.5) -> int | None:
    """The dead process's exit code: its socket closes a moment before the forkserver reports it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while (code := proc.process.exitcode) is None and loop.time() < deadline:
        await asyncio.sleep(0.01)
    return code


class EnvProcesses:
    """N supervised processes; `start()` once, `close()` at shutdown (bounded). Safe to share between the
    workers of one process (they share its event loop)."""

    def __init__(self, size: int | None = None, *, start_method: str = "forkserver",
                 queue_timeout_s: float = QUEUE_TIMEOUT_S, overflow: int = OVERFLOW_FACTOR) -> None:
        self.size = size or default_size()
        self.max_size = self.size * max(1, overflow)
        self.queue_timeout_s = queue_timeout_s
        self._ctx = mp.get_context(start_method)
        if start_method == "forkserver":
            # Imported once in the forkserver, so a new process starts in milliseconds (also after a kill).
            self._ctx.set_forkserver_preload(["__main__", "gymflow.activities.env_child"])
        self._procs: set[_Proc] = set()
        self._idle: deque[_Proc] = deque()
        self._waiters: deque[tuple[str, asyncio.Future[_Proc]]] = deque()  # (share key, waiter), oldest first
        self._busy_by: Counter[str] = Counter()  # share key -> processes serving its calls now
        # Fair share: one key (an environment) holds at most `share` processes, so the calls of another always
        # find one, however many of the first key's run to their limit (a hostile input of one environment);
        # a process that frees goes to the waiting key holding fewest.
        self.share = max(1, self.max_size - max(1, self.size // 2))
        self._starting: set[_Proc] = set()  # started, not yet ready
        self._background: set[asyncio.Task[None]] = set()
        self._keys: OrderedDict[int, tuple[Task, str, bytes]] = OrderedDict()
        # Environments loaded lately (name -> the memory cap it loaded under), most recent last: a new process loads
        # them before it takes calls, so a replacement's first call does not pay the import (math-verify's SymPy
        # takes seconds on a loaded box) inside its activity's timeout.
        self._warm: OrderedDict[str, int] = OrderedDict()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._grow_timer: asyncio.TimerHandle | None = None
        self._started = self._closed = False
        self._failed_starts, self._start_error = 0, ""

    # ---- lifecycle ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the processes (each becomes usable once it says it is ready). Idempotent."""
        if self._started:
            return
        self._started = True
        for _ in range(self.size):
            proc = _Proc(self._ctx)
            proc.start()
            self._procs.add(proc)
            self._starting.add(proc)
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # started outside a loop: the first call's loop watches the starts
            return
        self._bind()  # watched from now on, so the processes are ready before the first call

    async def close(self, grace_s: float = 2.0) -> None:
        """Stop every process: an idle one exits when its socket closes, a busy one is killed; whatever is still
        alive after `grace_s` is killed. Calls in flight or queued fail retryably. Idempotent, bounded."""
        if self._closed:
            return
        self._closed = True
        while self._waiters:
            _, waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(EnvProcessesClosed("environment processes are shutting down"))
        for task in list(self._background):
            task.cancel()
        procs = list(self._procs)
        idle = set(self._idle)
        for proc in procs:
            if proc in idle:
                proc.sock.close()
            else:
                proc.kill()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        while any(p.alive() for p in procs) and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for proc in procs:
            proc.kill()
        await asyncio.gather(*(asyncio.to_thread(p.reap) for p in procs), return_exceptions=True)
        self._procs.clear()
        self._idle.clear()

    def _bind(self) -> asyncio.AbstractEventLoop:
        """The processes are driven from one event loop; a new loop (a test's) takes them over, restarting any
        whose start the old loop was watching."""
        loop = asyncio.get_running_loop()
        if self._closed:
            raise EnvProcessesClosed("environment processes are closed")
        if not self._started:
            self.start()
        if loop is not self._loop:
            self._loop = loop
            self._waiters.clear()
            self._background.clear()
            self._grow_timer = None
            for proc in list(self._starting):
                self._watch_start(proc)
        return loop

    def _spawn(self) -> None:
        proc = _Proc(self._ctx)
        self._procs.add(proc)
        self._starting.add(proc)
        self._watch_start(proc, start=True)

    def _watch_start(self, proc: _Proc, start: bool = False) -> None:
        task = asyncio.get_running_loop().create_task(self._until_ready(proc, start))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _until_ready(self, proc: _Proc, start: bool) -> None:
        loop = asyncio.get_running_loop()
        try:
            if start:
                await asyncio.to_thread(proc.start)  # a forkserver round trip: kept off the loop
            hello = await asyncio.wait_for(_recv(loop, proc.sock), START_TIMEOUT_S)
            if not hello or hello[0] != "ready":
                raise RuntimeError(f"the process answered {hello!r} instead of ready")
        except asyncio.CancelledError:
            self._starting.discard(proc)
            self._procs.discard(proc)
            proc.kill()
            raise
        except Exception as e:  # a process that cannot start: try again, slowly, so the pool keeps its size
            log.warning("environment process did not start (%s); retrying in 5 s", e)
            self._starting.discard(proc)
            self._procs.discard(proc)
            self._failed_starts += 1
            self._start_error = f"environment processes cannot start: {e}"
            if self._broken():  # nothing could serve the callers waiting: they fail now, retryably
                while self._waiters:
                    _, waiter = self._waiters.popleft()
                    if not waiter.done():
                        waiter.set_exception(EnvProcessesBusy(self._start_error))
            await asyncio.to_thread(proc.reap)
            await asyncio.sleep(5)
            if not self._closed:
                self._spawn()
            return
        self._failed_starts = 0
        if not await self._preload(proc):
            return
        self._starting.discard(proc)
        if self._closed:  # became ready as the pool closed: nothing will use it
            self._procs.discard(proc)
            await asyncio.to_thread(proc.reap)
            return
        self._release(proc)

    async def _preload(self, proc: _Proc) -> bool:
        """Load the lately used environments into a new process while no caller waits for one (a waiter's own
        call loads what it needs). False when the process died doing so (it is replaced)."""
        for name, memory_mb in list(self._warm.items()):
            if self._closed or any(not w.done() for _, w in self._waiters):
                break
            try:
                reply = await self._exchange(proc, ("load", memory_mb, name, entry_point_value(name)), LOAD_TIMEOUT_S,
                                             "load")
            except (CallFailed, GymflowError, EnvProcessesClosed) as e:
                log.warning("environment process could not preload %s (%s); replaced", name, e)
                self._warm.pop(name, None)  # not again: a load that kills its process would respawn forever
                self._starting.discard(proc)
                self._replace(proc)
                return False
            if reply[0] != "raised":
                proc.loaded.add(name)
        return True

    def _broken(self) -> bool:
        """Starts keep failing and no process is up."""
        return self._failed_starts >= 3 and len(self._procs) == len(self._starting)

    def _held(self) -> int:
        """Processes busy on one call for longer than HELD_S."""
        now = asyncio.get_running_loop().time()
        return sum(1 for p in self._procs if p.busy_since is not None and now - p.busy_since >= HELD_S)

    def _grow(self) -> None:
        """Start extra processes for waiting callers while some are held by long calls: the processes not held
        stay at `size` at least, and all of them at `max_size` at most. Looks again every HELD_S while anyone
        waits (a busy process may become held meanwhile)."""
        self._grow_timer = None
        waiting = sum(1 for key, w in self._waiters if not w.done() and self._busy_by[key] < self.share)
        if self._closed or not waiting:
            return
        target = min(self.max_size, self.size + self._held())
        while len(self._procs) < target and len(self._starting) < waiting:
            self._spawn()
        if len(self._procs) < self.max_size:
            self._grow_timer = asyncio.get_running_loop().call_later(HELD_S, self._grow)

    def _assign(self, proc: _Proc, key: str) -> _Proc:
        proc.share = key
        self._busy_by[key] += 1
        return proc

    def _unassign(self, proc: _Proc) -> None:
        if proc.share is not None:
            self._busy_by[proc.share] -= 1
            if self._busy_by[proc.share] <= 0:
                del self._busy_by[proc.share]
            proc.share = None

    def _next_waiter(self) -> tuple[str, asyncio.Future[_Proc]] | None:
        """The oldest waiter of the key holding fewest processes, among keys under their share."""
        best: tuple[str, asyncio.Future[_Proc]] | None = None
        for entry in self._waiters:
            key, waiter = entry
            if waiter.done() or self._busy_by[key] >= self.share:
                continue
            if best is None or self._busy_by[key] < self._busy_by[best[0]]:
                best = entry
        self._waiters = deque(e for e in self._waiters if not e[1].done() and e is not best)
        return best

    def _release(self, proc: _Proc) -> None:
        proc.busy_since = None
        self._unassign(proc)
        chosen = self._next_waiter()
        if chosen is not None:
            key, waiter = chosen
            waiter.set_result(self._assign(proc, key))
            return
        if len(self._procs) > self.size + self._held():  # an extra nobody needs now: it exits on EOF
            self._procs.discard(proc)
            proc.sock.close()
            task = asyncio.get_running_loop().create_task(asyncio.to_thread(proc.reap))
            self._background.add(task)
            task.add_done_callback(self._background.discard)
            return
        self._idle.append(proc)

    def _replace(self, proc: _Proc) -> None:
        """Kill `proc` (its state is unknown) and start another in its place."""
        self._unassign(proc)
        proc.kill()
        self._procs.discard(proc)
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(proc.reap))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        if not self._closed:
            self._spawn()

    async def _acquire(self, key: str) -> _Proc:
        """A free process for a call of `key` (its fair-share key), waiting at most queue_timeout_s."""
        self._bind()
        if self._idle and self._busy_by[key] < self.share:
            return self._assign(self._idle.popleft(), key)
        if self._broken():
            raise EnvProcessesBusy(self._start_error)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[_Proc] = loop.create_future()
        self._waiters.append((key, waiter))
        if self._grow_timer is None:
            self._grow()
        try:
            return await asyncio.wait_for(waiter, self.queue_timeout_s)
        except BaseException as e:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                self._release(waiter.result())  # handed over just as this wait ended: pass it on
            else:
                waiter.cancel()
            if isinstance(e, TimeoutError):
                raise EnvProcessesBusy(f"no environment process was free for {self.queue_timeout_s:g} s") from None
            raise

    # ---- one call -----------------------------------------------------------------------------------

    def _task_key(self, task: Task) -> tuple[str, bytes]:
        """A key naming the task's content, and its wire JSON; computed once per Task object (the activities
        cache their tasks)."""
        hit = self._keys.get(id(task))
        if hit is not None and hit[0] is task:
            self._keys.move_to_end(id(task))
            return hit[1], hit[2]
        raw = task.model_dump_json().encode()
        key = hashlib.blake2b(raw, digest_size=16).hexdigest()
        self._keys[id(task)] = (task, key, raw)  # holding the task keeps its id from being reused
        if len(self._keys) > _TASK_KEYS_KEPT:
            self._keys.popitem(last=False)
        return key, raw

    async def _exchange(self, proc: _Proc, req: tuple[Any, ...], timeout_s: float, what: str) -> tuple[Any, ...]:
        """Send one request and wait for its reply, killing the process at `timeout_s`."""
        loop = asyncio.get_running_loop()
        payload = pickle.dumps(req, protocol=pickle.HIGHEST_PROTOCOL)
        if len(payload) > MAX_FRAME_BYTES:
            raise GymflowError(f"{what}: the request is {len(payload)} bytes, over {MAX_FRAME_BYTES}",
                               failure_type=ENVIRONMENT_ERROR)
        proc.expired = False
        timer = loop.call_later(timeout_s, self._expire, proc)
        try:
            await loop.sock_sendall(proc.sock, HEADER.pack(len(payload)) + payload)
            reply = await _recv(loop, proc.sock)
        except OSError:
            reply = None
        except UnreadableReply as e:
            raise CallFailed("crashed", f"sent {e}") from None
        finally:
            timer.cancel()
        if reply is None:
            if self._closed:
                raise EnvProcessesClosed("environment processes are shutting down")
            if proc.expired:
                raise CallFailed("timeout", f"exceeded its {timeout_s:g} s limit")
            code = await _exit_code(proc)
            how = f"exit code {code}" if code is not None and code >= 0 else \
                f"signal {-code}" if code is not None else "it died"
            raise CallFailed("crashed", f"ended its process ({how})")
        if reply[0] == "memory":
            raise CallFailed("memory", f"exceeded its {req[1]} MB memory limit")
        return reply

    @staticmethod
    def _expire(proc: _Proc) -> None:
        proc.expired = True
        proc.kill()

    async def _call(self, op: str, task: Task | None, rest: tuple[Any, ...], timeout_s: float, memory_mb: int,
                    what: str) -> Any:
        """One request on a free process. With `task`, its environment is loaded there first (untimed by the
        call's limit), and for every op but "call" the task travels with it (by key once the process holds it)."""
        key = task.env if task is not None else f"call:{what}"
        for _ in range(RESPAWNS):
            proc = await self._acquire(key)
            proc.busy_since = asyncio.get_running_loop().time()
            healthy = False
            try:
                reply = await self._load(proc, task, memory_mb) if task is not None else None
                if reply is None:
                    reply = await self._request(proc, op, task, rest, timeout_s, memory_mb, what)
                healthy = reply[0] != "respawn"
            finally:
                if healthy:
                    self._release(proc)
                else:  # timed out, died, cancelled, shutting down, or may not raise its memory cap: replaced
                    self._replace(proc)
            if reply[0] != "respawn":
                break
        else:
            raise CallFailed("crashed", f"found no process that could take its {memory_mb} MB memory cap")
        if reply[0] == "raised":
            _raise_remote(reply)
        return reply[1]

    async def _load(self, proc: _Proc, task: Task, memory_mb: int) -> tuple[Any, ...] | None:
        """Import the task's environment and run its warm_up in `proc`, under LOAD_TIMEOUT_S, not the call's
        limit. None when loaded; the ("raised", ...) reply when the environment raised."""
        name = task.env
        if name in proc.loaded:
            return None
        try:
            reply = await self._exchange(proc, ("load", memory_mb, name, entry_point_value(name)), LOAD_TIMEOUT_S,
                                         "load")
        except CallFailed as e:
            raise GymflowError(f"loading environment {name!r} into a supervised process {e.detail}",
                               failure_type=ENVIRONMENT_ERROR) from None
        if reply[0] == "raised":
            return reply
        proc.loaded.add(name)
        self._warm[name] = memory_mb
        self._warm.move_to_end(name)
        while len(self._warm) > _WARM_KEPT:
            self._warm.popitem(last=False)
        return None

    async def _request(self, proc: _Proc, op: str, task: Task | None, rest: tuple[Any, ...], timeout_s: float,
                       memory_mb: int, what: str) -> tuple[Any, ...]:
        if task is None or op == "call":
            return await self._exchange(proc, (op, memory_mb, *rest), timeout_s, what)
        key, raw = self._task_key(task)
        head = (task.env, entry_point_value(task.env), key)
        loop = asyncio.get_running_loop()
        start = loop.time()
        reply = await self._exchange(proc, (op, memory_mb, *head, None if key in proc.tasks else raw, *rest),
                                     timeout_s, what)
        if reply[0] == "need_task":  # the process no longer holds the task: once more, with it
            left = timeout_s - (loop.time() - start)
            reply = await self._exchange(proc, (op, memory_mb, *head, raw, *rest), max(left, 0.001), what)
        proc.tasks[key] = None
        proc.tasks.move_to_end(key)
        if len(proc.tasks) > _TASKS_KEPT:
            proc.tasks.popitem(last=False)
        return reply

    # ---- the calls, typed -----------------------------------------------------------------------------

    @staticmethod
    def isolates(env: Environment, task: Task, options: JSON, step: Step) -> bool:
        return not env.runs_in_loop(task, options, step)

    async def setup(self, task: Task, limits: Limits
                    ) -> tuple[list[ChatMessage], JSON, tuple[ToolSpec, ...]]:
        """(initial messages, initial state, tool schemas)."""
        try:
            return await self._call("setup", task, (), limits.setup_s, limits.memory_mb, "setup")
        except CallFailed as e:
            raise GymflowError(e.describe(f"{task.env} setup"), failure_type=ENVIRONMENT_ERROR) from None

    async def tool(self, task: Task, state: JSON, call: ToolCall, limits: Limits) -> ToolResult:
        try:
            return await self._call("tool", task, (state, call), limits.tool_s, limits.memory_mb, "tool call")
        except CallFailed as e:
            return tool_error(call, state, e.describe("tool call"))

    async def verify(self, task: Task, messages: Sequence[ChatMessage], state: JSON,
                     policy_model: str, options: JSON, limits: Limits) -> Score:
        try:
            return await self._call("verify", task, (list(messages), state, policy_model, options),
                                    limits.verify_s, limits.memory_mb, "verify")
        except CallFailed as e:
            kind = VERIFIER_TIMEOUT if e.kind == "timeout" else VERIFIER_CRASHED
            return Score(reward=None, masked=True, failure_type=kind, details={"error": e.describe("verify")})

    async def run(self, fn: Callable[..., Any], args: tuple[Any, ...], limits: Limits, task: Task | None = None
                  ) -> Any:
        """`fn(*args)` (a module-level function) under the verify limits: `VerifyContext.run_isolated`. With `task`,
        its environment is loaded (and warmed up: math-verify imported) before the call's clock starts."""
        what = getattr(fn, "__qualname__", "check")
        try:
            return await self._call("call", task, (fn, args), limits.verify_s, limits.memory_mb, what)
        except CallFailed as e:
            raise VerifierError(e.describe(what), failure_type=VERIFIER_TIMEOUT if e.kind == "timeout"
                                else VERIFIER_CRASHED) from None


def _raise_remote(reply: tuple[Any, ...]) -> None:
    _, blob, cls, message, tb = reply
    exc: Any = None
    if blob is not None:
        try:
            exc = pickle.loads(blob)
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RemoteError(f"{cls}: {message}")
    if tb:
        exc.__cause__ = RemoteTraceback(tb)
    raise exc
