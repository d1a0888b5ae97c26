"""The supervised environment process: runs one environment call at a time for activities/env_processes.py.

It reads framed requests (8-byte big-endian length, then a pickle) from its socket and answers each with one
frame. Its stdout and stderr are /dev/null (a tool that prints without end floods nothing), its address space is
capped per call (RLIMIT_AS), and it dies with the forkserver it was forked from, which dies with the worker.
The parent enforces the wall clock: it SIGKILLs a process whose call overran and starts another.

Requests: ("load", mem, name, value), ("setup", mem, name, key, task_json), ("tool", ..., state, call),
("verify", ..., messages, state, policy_model, options), ("call", mem, fn, args). A task travels as its wire
JSON the first time a process needs it (it answers ("need_task",) for a key it does not hold) and is cached here,
parsed, by key. Replies: ("ready", pid), ("ok", value), ("need_task",), ("raised", pickled exception or None,
class name, first line, traceback), ("memory",) (then the process exits: the parent replaces it).
"""

from __future__ import annotations

import asyncio
import os
import pickle
import resource
import signal
import socket
import struct
import sys
import traceback
from collections import OrderedDict
from typing import Any

from gymflow.activities.capabilities import drop_sys_resource
from gymflow.activities.env_calls import score, tool_result
from gymflow.activities.process_tree import become_subreaper, kill_descendants
from gymflow.environments.base import Environment, TaskData, VerifyContext
from gymflow.environments.registry import environment_at

from gymflow.kernel.failures import short_message
from gymflow.kernel.wire import Task

HEADER = struct.Struct("!Q")
MAX_FRAME_BYTES = 256 << 20  # a request (a long transcript to verify, a tool's state); over it is an error
# A reply is unpickled in the worker: its size bounds what it costs the worker (a 10-million-element reply once took
# a worker from 35 to 465 MB). A state is bounded at 16 MiB of JSON (activities/episode.py MAX_STATE_BYTES).
MAX_REPLY_BYTES = 48 << 20
_TASKS_KEPT = 256
_MEMORY_REPLY = pickle.dumps(("memory",))  # built before any cap applies: answering it allocates nothing new


class NeedTask(Exception):
    pass


class MemoryCapRaised(Exception):
    """A call needs a larger memory cap than this process may set any more: the parent starts a fresh one."""


def send_frame(sock: socket.socket, payload: bytes) -> None:
    if len(payload) < 65536:  # one syscall; a large payload is not copied to prepend the header
        sock.sendall(HEADER.pack(len(payload)) + payload)
    else:
        sock.sendall(HEADER.pack(len(payload)))
        sock.sendall(payload)


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            return None
        got += k
    return bytes(buf)


class _Child:
    def __init__(self) -> None:
        self.tasks: OrderedDict[str, tuple[Task, TaskData]] = OrderedDict()
        self.loop = asyncio.new_event_loop()
        self.memory_mb = 0

    def cap_memory(self, mb: int) -> None:
        """Soft and hard limit both: with only the soft one, code in the call could raise it to the hard one and
        allocate past the cap. Raising the hard limit again for a later call with a larger cap needs
        CAP_SYS_RESOURCE (a root worker has it); without it, that call's process is replaced (MemoryCapRaised)."""
        if mb == self.memory_mb:
            return
        if mb <= 0:
            raise ValueError(f"memory cap of {mb} MB: every call has a cap")
        try:
            resource.setrlimit(resource.RLIMIT_AS, (mb << 20, mb << 20))
        except (ValueError, OSError):
            raise MemoryCapRaised from None
        self.memory_mb = mb

    def task(self, env: Environment, key: str, task_json: bytes | None) -> tuple[Task, TaskData]:
        if key in self.tasks:
            self.tasks.move_to_end(key)
            return self.tasks[key]
        if task_json is None:
            raise NeedTask
        task = Task.model_validate_json(task_json)
        parsed = (task, env.parse_task(task))
        self.tasks[key] = parsed
        if len(self.tasks) > _TASKS_KEPT:
            self.tasks.popitem(last=False)
        return parsed

    def handle(self, req: tuple[Any, ...]) -> Any:
        op, mem, *rest = req
        self.cap_memory(mem)
        if op == "load":
            name, value = rest
            environment_at(name, value).warm_up()
            return None
        if op == "call":
            fn, args = rest
            return fn(*args)
        name, value, key, task_json, *more = rest
        env = environment_at(name, value)
        task, data = self.task(env, key, task_json)
        if op == "setup":
            return (list(env.initial_messages(task, data)), env.setup(task, data), tuple(env.tools(task, data)))
        if op == "tool":
            state, call = more
            return self.loop.run_until_complete(tool_result(env, task, data, state, call))
        if op == "verify":
            messages, state, policy_model, options = more
            ctx = VerifyContext(policy_model=policy_model, options=options)  # no judge, and already isolated
            return self.loop.run_until_complete(score(env, data, messages, state, ctx))
        raise ValueError(f"unknown request {op!r}")


def _raised(e: BaseException) -> tuple[Any, ...]:
    """The exception for the parent to raise again: pickled when it survives a round trip, else by name."""
    try:
        blob: bytes | None = pickle.dumps(e)
        pickle.loads(blob)
    except Exception:
        blob = None
    tb = "".join(traceback.format_exception(e))[-8000:]
    return ("raised", blob, type(e).__qualname__, short_message(e), tb)


def _quiet() -> None:
    """stdin, stdout, stderr to /dev/null; no SIGINT (the worker stops its processes itself); die with the parent."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the forkserver's death
    except (OSError, AttributeError):
        pass
    # Numeric libraries would start a thread per core in each of N processes.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")


CHILD_NICE = 10


def serve(sock: socket.socket) -> None:
    """The process's main loop: one request at a time until the parent closes the socket."""
    _quiet()
    try:  # below the worker and the stack: a call that burns CPU to its limit slows the others less
        os.nice(CHILD_NICE)
    except OSError:
        pass
    sock.setblocking(True)
    become_subreaper()  # what a call's processes orphan stays below this one, where kill_tree finds it
    drop_sys_resource()  # a root worker's call could otherwise raise its own memory cap back
    child = _Child()
    send_frame(sock, pickle.dumps(("ready", os.getpid())))
    while True:
        head = recv_exact(sock, HEADER.size)
        if head is None:
            os._exit(0)
        (n,) = HEADER.unpack(head)
        body = recv_exact(sock, n) if n <= MAX_FRAME_BYTES else None
        if body is None:
            os._exit(0)
        try:
            reply: tuple[Any, ...] = ("ok", child.handle(pickle.loads(body)))
            payload = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except NeedTask:
            payload = pickle.dumps(("need_task",))
        except MemoryCapRaised:
            send_frame(sock, pickle.dumps(("respawn",)))
            os._exit(0)
        except MemoryError:
            _out_of_memory(sock)
        except Exception as e:
            payload = pickle.dumps(_raised(e))
        except BaseException:  # SystemExit and the like: the environment ended its process
            sys.stdout.flush()
            os._exit(3)
        kill_descendants()  # nothing a call started outlives it
        if len(payload) > MAX_REPLY_BYTES:
            payload = pickle.dumps(("raised", None, "ReplyTooLarge",
                                    f"the reply is {len(payload)} bytes, over {MAX_REPLY_BYTES}", ""))
        send_frame(sock, payload)


def _out_of_memory(sock: socket.socket) -> None:
    try:
        sock.sendall(HEADER.pack(len(_MEMORY_REPLY)) + _MEMORY_REPLY)
    finally:
        os._exit(4)  # what ran out of memory may have left anything half-done: the parent starts a new process
