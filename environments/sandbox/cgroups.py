"""Whole-sandbox memory and task caps: one memory+pids cgroup per run (cgroup v1 or v2).

rlimits bind each process: 32 processes under a 4 GiB RLIMIT_AS may use 128 GiB, and tmpfs pages are
charged to nobody. A cgroup binds the sum (anonymous memory, tmpfs pages, kernel memory) and counts every
task of the sandbox. The run's first process, a `/bin/sh` shim, writes its own pid into the cgroup and
only then execs bwrap, so no program code ever runs outside it; when we are root the shim drops to the
sandbox uid with `setpriv` after joining (cgroup v2 lets only a writer that controls the common ancestor
move a process). After the run every process left in the cgroup is killed and the cgroup removed.
An OOM kill inside it is read from memory.oom_control (v1) or memory.events (v2).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import uuid
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

ROOT = Path("/sys/fs/cgroup")
DISABLE_ENV = "GYMFLOW_SANDBOX_NO_CGROUPS"  # "1": use only rlimits (for comparisons and odd hosts)
_BASE = "gymflow-sandbox"
# dash exports PWD (the worker's working directory) to what it execs: unset it, the environment stays empty.
_SHIM = 'unset PWD; while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-run cgroups go: v1 has one directory per controller, v2 one for both."""

    version: int
    memory_base: Path
    pids_base: Path

    def describe(self) -> str:
        where = str(self.memory_base) if self.version == 2 else f"{self.memory_base} and {self.pids_base}"
        return f"cgroup v{self.version} under {where}"


@dataclass(frozen=True)
class Probe:
    support: CgroupSupport | None
    reason: str  # why not, when support is None


@functools.cache
def probe() -> Probe:
    """Find (and prepare) a place for per-run cgroups; cached for the life of the process."""
    if os.environ.get(DISABLE_ENV) == "1":
        return Probe(None, f"disabled by {DISABLE_ENV}=1")
    try:
        if (ROOT / "cgroup.controllers").exists():
            return Probe(_prepare_v2(), "")
        return Probe(_prepare_v1(), "")
    except (OSError, ValueError) as err:
        return Probe(None, f"{type(err).__name__}: {err}")


class RunCgroup:
    """The cgroup(s) of one run: created with the limits, joined by the shim, killed and removed after."""

    def __init__(self, support: CgroupSupport, memory_bytes: int, max_tasks: int) -> None:
        self.support = support
        name = f"run-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.memory = support.memory_base / name
        self.pids = support.pids_base / name
        self.dirs = [self.memory] if support.version == 2 else [self.memory, self.pids]
        made: list[Path] = []
        try:
            for path in self.dirs:
                path.mkdir()
                made.append(path)
            self._limit(memory_bytes, max_tasks)
        except OSError:
            for path in reversed(made):
                with contextlib.suppress(OSError):
                    path.rmdir()
            raise

    def _limit(self, memory_bytes: int, max_tasks: int) -> None:
        if self.support.version == 2:
            _write(self.memory / "memory.max", memory_bytes)
            _write_if_present(self.memory / "memory.swap.max", 0)  # swap would be memory outside the cap
            _write_if_present(self.memory / "memory.oom.group", 1)  # an OOM kill ends the whole sandbox
            _write(self.pids / "pids.max", max_tasks)
            return
        _write(self.memory / "memory.limit_in_bytes", memory_bytes)
        _write_if_present(self.memory / "memory.memsw.limit_in_bytes", memory_bytes)  # after: memsw >= limit
        _write(self.pids / "pids.max", max_tasks)

    def procs_files(self) -> list[str]:
        return [str(path / "cgroup.procs") for path in self.dirs]

    def wrap(self, argv: list[str], run_as_uid: int | None) -> list[str]:
        """`argv` behind the shim that joins the cgroup(s) first (and then drops to `run_as_uid`)."""
        drop = [] if run_as_uid is None else [
            "/usr/bin/setpriv", f"--reuid={run_as_uid}", f"--regid={run_as_uid}", "--clear-groups", "--"]
        return ["/bin/sh", "-c", _SHIM, "gymflow-cgroup", *self.procs_files(), "--", *drop, *argv]

    def oom_killed(self) -> bool:
        if self.support.version == 2:
            return _counter(self.memory / "memory.events", "oom_kill") > 0
        return _counter(self.memory / "memory.oom_control", "oom_kill") > 0

    def kill_all(self) -> None:
        kill = self.memory / "cgroup.kill"  # v2, Linux 5.14+: atomic, forks cannot escape it
        if self.support.version == 2 and kill.exists():
            with contextlib.suppress(OSError):
                _write(kill, 1)
        for path in self.dirs:
            for pid in _pids(path):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)

    async def remove(self, wait_s: float = 5.0) -> None:
        """Kill what is left and remove the directories; a dying process keeps them busy for a moment."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        for path in self.dirs:
            while True:
                self.kill_all()
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if loop.time() > deadline:
                        log.warning("sandbox cgroup %s still busy after %.0f s; left behind", path, wait_s)
                        break
                    await asyncio.sleep(0.01)


# ---- preparation ---------------------------------------------------------------------------------


def _own_path(controller: str) -> str:
    """This process's cgroup path in a hierarchy ('' = the unified v2 one), from /proc/self/cgroup."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(",") if controller else controllers == "":
            return path.lstrip("/")
    raise ValueError(f"this process is in no {controller or 'v2'} cgroup")


def _prepare_v1() -> CgroupSupport:
    bases = []
    for controller in ("memory", "pids"):
        mount = ROOT / controller
        if not (mount / "cgroup.procs").exists():
            raise ValueError(f"no cgroup v1 {controller} hierarchy at {mount}")
        base = mount / _own_path(controller) / _BASE
        base.mkdir(exist_ok=True)
        _sweep(base)
        bases.append(base)
    return CgroupSupport(1, bases[0], bases[1])


def _prepare_v2() -> CgroupSupport:
    own = ROOT / _own_path("")
    needed = {"memory", "pids"}
    missing = needed - set((own / "cgroup.controllers").read_text().split())
    if missing:
        raise ValueError(f"cgroup v2 controllers {sorted(missing)} not delegated to {own}")
    enabled = set((own / "cgroup.subtree_control").read_text().split())
    if not needed <= enabled:  # refused (EBUSY) when our own cgroup holds processes: then we cannot nest
        _write(own / "cgroup.subtree_control", " ".join(f"+{c}" for c in sorted(needed - enabled)))
    base = own / _BASE
    base.mkdir(exist_ok=True)
    if not needed <= set((base / "cgroup.subtree_control").read_text().split()):
        _write(base / "cgroup.subtree_control", "+memory +pids")
    _sweep(base)
    return CgroupSupport(2, base, base)


def _sweep(base: Path) -> None:
    # Per-run cgroups of a worker that died before removing them (named run-<pid>-...).
    for child in base.glob("run-*"):
        pid = child.name.split("-")[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                child.rmdir()


# ---- small file helpers ------------------------------------------------------------------------


def _write(path: Path, value: int | str) -> None:
    path.write_text(f"{value}\n")


def _write_if_present(path: Path, value: int) -> None:
    if path.exists():
        _write(path, value)


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def _pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except OSError:
        return []
