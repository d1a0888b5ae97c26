"""`describe_limits()`: one line saying which sandbox limits are in force on this machine, for the worker's log."""

from __future__ import annotations

import os
import shutil

from gymflow.environments.sandbox.cgroups import probe
from gymflow.environments.sandbox.seccomp_filter import DENIED, seccomp_unavailable
from gymflow.environments.sandbox.types import UNSAFE_ENV


def describe_limits() -> str:
    """Which isolation and limits a sandboxed program gets here, and what is missing (never raises)."""
    if not shutil.which("bwrap"):
        if os.environ.get(UNSAFE_ENV, "") == "1":
            return (f"NO SANDBOX ({UNSAFE_ENV}=1, bwrap missing): model code runs with rlimits, a wall clock and an "
                    "output cap only; it can read this machine's files and use the network")
        return "no sandbox: bwrap is missing, code_gen rollouts are masked"
    seccomp = seccomp_unavailable()
    if seccomp:
        return f"no sandbox: {seccomp}; code_gen rollouts are masked"
    found = probe()
    parts = [f"bwrap namespaces; seccomp filter denying {len(DENIED)} syscalls plus namespace clones and clone3",
             "size-capped tmpfs for /tmp, the working dir and /dev/shm, /dev read-only"]
    if found.support is not None:
        parts.append(f"whole-sandbox memory and task caps by {found.support.describe()}")
        parts.append("per process: CPU time, address space, file size, open files, no core dumps")
    else:
        parts.append(f"NO whole-sandbox caps (cgroups unavailable: {found.reason}): memory is capped per process "
                     "(RLIMIT_AS, so N processes may use N times it) and tasks by RLIMIT_NPROC")
        parts.append("per process: CPU time, address space, file size, open files, no core dumps")
    return "sandbox limits: " + "; ".join(parts)
