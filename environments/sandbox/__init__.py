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
- A seccomp filter (`seccomp_filter.py`, loaded by bwrap right before the program starts) denies ptrace,
  new namespaces, mounts, the keyring, bpf, perf, userfaultfd, io_uring, module loading and SysV IPC.
- Every writable mount is a size-capped tmpfs (/tmp, the working dir, /dev/shm); /dev itself is read-only.
- Whole-sandbox caps (`cgroups.py`): a memory+pids cgroup per run, joined by a shim before bwrap starts,
  so `memory_bytes` and `max_procs` bind the sum of the sandbox's processes (tmpfs pages included); an
  OOM kill inside it is reported as `memory`. Without usable cgroups those caps are per process only;
  `describe_limits()` says which applies, and the env worker logs it at start.
- rlimits set inside by `prlimit` (util-linux): CPU, address space, processes, file size, open
  files, no core dumps. Not `preexec_fn`: that is unsafe in threaded processes (Temporal workers).
  The bootstrap copies them onto pid 1 (bwrap's init) before any program code runs: a program can write
  the init's memory through /proc/1/mem and run code there, and would otherwise escape them.
  New threads get an 8 MiB stack (`thread_stack_bytes`), so a raised RLIMIT_STACK does not make each
  thread reserve it under the address-space limit.
- When we run as root the sandbox runs as `nobody` (65534): the kernel never applies RLIMIT_NPROC to
  uid 0, so a fork bomb would otherwise only be stopped by the wall clock.
- stdout and stderr are read incrementally; past `output_bytes` the sandbox is killed. A wall-clock
  timeout kills the process group (bwrap), and `--die-with-parent` takes the namespace down with it.
  Output read before a kill is kept even when the pipes take a while to close. See docs/security.md.
- bwrap exits before its pid namespace's init, orphaning it: the process running sandboxes makes itself a
  child subreaper and reaps each run's init (`reaper.py`), so no host needs an init process (`init: true`).

Unsandboxed mode (`UnsandboxedRunner`) keeps the rlimits (minus the process limit), the output cap and
the timeout but isolates nothing: the code can read and write your files and use the network. It is
used only when bwrap is missing and the caller opted in, with `get_sandbox(allow_unsandboxed=True)` or
`GYMFLOW_UNSAFE_NO_SANDBOX=1`. Never enable it on a machine with anything worth protecting.
"""

from __future__ import annotations

from gymflow.environments.sandbox.contract import Sandbox
from gymflow.environments.sandbox.report import describe_limits
from gymflow.environments.sandbox.runners import BubblewrapSandbox, UnsandboxedRunner, default_python, get_sandbox
from gymflow.environments.sandbox.types import (
    MISSING_BWRAP,
    NOBODY,
    PYTHON_ENV,
    UNSAFE_ENV,
    WORKDIR,
    Limits,
    SandboxResult,
    SandboxStatus,
    SandboxUnavailable,
)

__all__ = [
    "MISSING_BWRAP",
    "NOBODY",
    "PYTHON_ENV",
    "UNSAFE_ENV",
    "WORKDIR",
    "BubblewrapSandbox",
    "Limits",
    "Sandbox",
    "SandboxResult",
    "SandboxStatus",
    "SandboxUnavailable",
    "UnsandboxedRunner",
    "default_python",
    "describe_limits",
    "get_sandbox",
]
