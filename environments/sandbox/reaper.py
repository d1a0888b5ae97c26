"""Reap bwrap's pid-namespace init, which outlives the bwrap we spawned.

bwrap's outer process exits as soon as its init reports the program's exit status, without waiting for
the init itself. The init, orphaned, goes to the nearest child subreaper, else to host pid 1: where pid 1
does not reap (a container without `init: true`, a bare `docker run`), every run left a zombie. So the
process that runs sandboxes makes itself a child subreaper (before its first spawn: children inherit
the "an ancestor reaps" mark at fork) and reaps each run's init by its pid, the one bwrap wrote to
--info-fd. Never `waitpid(-1)`: asyncio's child watcher waits for its own pids and must keep them.
"""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import os
import sys

log = logging.getLogger(__name__)

_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_REAP_WAIT_S = 2.0  # the init dies right after bwrap (--die-with-parent); it only has to get there
_unreaped: set[int] = set()  # inits still alive when their run ended: retried at the next reap


@functools.cache
def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (once per process); False if unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        ok = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        ok = False
    if not ok:
        log.warning("cannot become a child subreaper; sandbox inits are left to pid 1 to reap")
    return ok


def _try_reap(pid: int) -> bool:
    """True when `pid` is gone for us: reaped now, or not our child (its bwrap or pid 1 reaped it)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return done != 0


async def reap_init(pid: int | None) -> None:
    """Reap a finished run's namespace init (and any earlier one that was slow to die), waiting a little."""
    if pid is not None:
        _unreaped.add(pid)
    deadline = asyncio.get_running_loop().time() + _REAP_WAIT_S
    while True:
        _unreaped.difference_update([p for p in list(_unreaped) if _try_reap(p)])
        if pid is None or pid not in _unreaped or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.01)
    if pid in _unreaped:
        log.debug("sandbox init %d still running after its run; reaped later", pid)
