"""A supervised process and everything it started die together (Linux).

A call's code may start processes (`subprocess`, in a session of their own or not, double-forked daemons). Killing
only the supervised process left them running, reparented to pid 1. So each supervised process makes itself a child
subreaper (`PR_SET_CHILD_SUBREAPER`): what its descendants orphan is reparented to it, not to pid 1, so the whole
tree stays below it, where `kill_tree` finds it (by walking /proc's parent links) and kills it, stopped first so that
nothing forks while it is collected. After each call the supervised process kills what the call left running
(`kill_descendants`) and reaps it. Where /proc or prctl are missing (not Linux), only the process itself is killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
_ROUNDS = 5  # stop-and-collect passes: a fork bomb racing the walk is caught within a few


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants; False where the kernel cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _children_map() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; the last ")" ends it.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 1:
            out.setdefault(int(fields[1]), []).append(int(entry.name))
    return out


def descendants(pid: int) -> list[int]:
    """Every live process below `pid`, parents before children."""
    children, found, queue = _children_map(), [], [pid]
    while queue:
        for child in children.get(queue.pop(0), ()):
            found.append(child)
            queue.append(child)
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and every process below it. Stopped first (it and each found descendant), so that none forks
    a new one between the walk and the kill."""
    if not Path("/proc").is_dir():
        _signal([pid], signal.SIGKILL)
        return
    _signal([pid], signal.SIGSTOP)
    seen: set[int] = set()
    for _ in range(_ROUNDS):
        found = [p for p in descendants(pid) if p not in seen]
        if not found:
            break
        _signal(found, signal.SIGSTOP)
        seen.update(found)
    _signal([*seen, pid], signal.SIGKILL)


def _has_children() -> bool:
    """Whether this process has a child (one file per thread; a subreaper's orphaned descendants are its children
    too): the cheap test after every call. True where the kernel does not say."""
    try:
        return any((task / "children").read_text().strip() for task in Path("/proc/self/task").iterdir())
    except OSError:
        return Path("/proc").is_dir()


def kill_descendants() -> None:
    """In a supervised process, after a call: kill what the call left running below it, and reap it."""
    me = os.getpid()
    if _has_children():
        for _ in range(_ROUNDS):
            found = descendants(me)
            if not found:
                break
            _signal(found, signal.SIGSTOP)
            _signal(found, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
