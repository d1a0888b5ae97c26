"""Shared vocabulary of the sandbox: constants, the error, the result status, limits, results and run records."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gymflow.kernel.errors import GymflowError

UNSAFE_ENV = "GYMFLOW_UNSAFE_NO_SANDBOX"
PYTHON_ENV = "GYMFLOW_SANDBOX_PYTHON"
NOBODY = 65534
WORKDIR = "/sandbox"
_CHUNK = 1 << 16
_MIB = 1 << 20
_MEMORY_MARKERS = (b"MemoryError", b"Cannot allocate memory")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_MERGED_USR = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# MALLOC_ARENA_MAX: glibc reserves 64 MiB of address space per malloc arena, up to 8 per core and one per
# thread, so under a 1 GiB address-space limit only ~14 threads could start.
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}

# Runs first inside the sandbox. Under bwrap (argv[3] == "1") it first gives pid 1, bwrap's namespace
# init, its own rlimits: that init is of the same uid and dumpable, so a program can write /proc/1/mem and
# run its code there, and bwrap starts it before any rlimit is set. Only lowering, never raising: a hard
# limit cannot be raised again without CAP_SYS_RESOURCE, which no one in the sandbox has. Then it reports
# "the interpreter started" on a pipe (so a sandbox that failed to set up, or whose init cannot be
# limited, is told apart from a program that failed), drops every inherited fd, sets the stack of new
# threads (glibc would give each one RLIMIT_STACK, which code_gen raises for deep recursion, and only a
# few such threads fit under the address-space limit), then runs main.py.
_BOOTSTRAP = (
    "import _thread, os, runpy, sys\n"
    "if sys.argv[3] == '1':\n"
    "    import resource\n"
    "    if os.getppid() != 1:\n"
    "        sys.exit('sandbox: this program is not the child of its namespace init')\n"
    "    for name in ('CPU', 'AS', 'FSIZE', 'NOFILE', 'CORE', 'NPROC', 'STACK'):\n"
    "        which = getattr(resource, 'RLIMIT_' + name)\n"
    "        resource.prlimit(1, which, resource.getrlimit(which))\n"
    "os.write(int(sys.argv[1]), b'1')\n"
    "os.closerange(3, 65536)\n"
    "_thread.stack_size(int(sys.argv[2]))\n"
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
    MEMORY = "memory"  # allocation failed under the address-space limit, or the sandbox's cgroup hit its cap
    OUTPUT_LIMIT = "output_limit"  # stdout/stderr over the cap, or a file over the size limit
    KILLED = "killed"  # ended by a signal we did not send (segfault, abort, OOM killer)
    ERROR = "error"  # the sandbox itself failed; says nothing about the program


@dataclass(frozen=True)
class Limits:
    """Each limit binds the whole sandbox where the kernel allows it (cgroups) and each process otherwise;
    `describe_limits()` says which applies on this machine."""

    wall_s: float = 10.0
    cpu_s: int = 10
    # RLIMIT_AS of each process, and with cgroups also the memory of the whole sandbox (tmpfs pages included)
    memory_bytes: int = 1 << 30
    # tasks (processes and threads): the pids cgroup of the sandbox, else RLIMIT_NPROC in its user namespace
    max_procs: int = 16
    file_bytes: int = 16 * _MIB  # RLIMIT_FSIZE
    output_bytes: int = 16 * _MIB  # stdout kept up to this; either stream past it kills the run
    stderr_bytes: int = 16 * 1024  # tail of stderr kept
    tmpfs_bytes: int = 64 * _MIB  # size of /tmp, of the working dir and of /dev/shm, each
    open_files: int = 256
    stack_bytes: int | None = None  # RLIMIT_STACK (the main thread's); None keeps the inherited one
    thread_stack_bytes: int = 8 * _MIB  # the stack of each new thread


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
    oom_killed: bool = False  # the kernel's OOM killer acted inside the sandbox's memory cgroup


@dataclass
class _Staged:
    cwd: str | None
    fds: tuple[int, ...]
    names: tuple[str, ...]
    extra_fds: tuple[int, ...] = ()  # passed to the child too (the seccomp filter)
