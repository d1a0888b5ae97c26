"""The syscall filter bwrap installs (`--seccomp FD`) just before it execs the sandboxed program.

Allow by default, deny what a program run for a verdict never needs and what reaches past its limits or
its namespaces: debugging other processes (ptrace, process_vm_*, pidfd_getfd), new namespaces (unshare,
setns, clone with a CLONE_NEW* flag), mounts, the kernel keyring, bpf, perf, userfaultfd, io_uring,
module and kexec loading, and SysV IPC (its segments outlive the processes that made them). clone3
answers ENOSYS: its flags sit in a struct seccomp cannot read, and glibc then falls back to clone.
Syscalls of other ABIs (32-bit int 0x80, x32) kill the process: libseccomp's default for a foreign arch.
Built with libseccomp through `pyseccomp` (the same API as libseccomp's own Python module).
"""

from __future__ import annotations

import errno
import functools
import os

# Denied with EPERM. Grouped by what they would give a program.
DENIED: tuple[str, ...] = (
    # other processes' memory and file descriptors
    "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp",
    # namespaces and filesystems
    "unshare", "setns", "mount", "umount", "umount2", "pivot_root", "chroot", "open_tree", "move_mount",
    "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "name_to_handle_at", "open_by_handle_at",
    # kernel attack surface a verdict never needs
    "add_key", "request_key", "keyctl", "bpf", "perf_event_open", "userfaultfd", "io_uring_setup",
    "io_uring_enter", "io_uring_register", "fanotify_init", "lookup_dcookie",
    # the machine itself
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot", "swapon",
    "swapoff", "acct", "quotactl", "syslog", "iopl", "ioperm", "settimeofday", "clock_settime", "clock_adjtime",
    "adjtimex", "vhangup", "uselib", "nfsservctl",
    # SysV IPC: segments outlive their processes and sit outside every per-process limit
    "shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop", "semctl",
    "ipc",
)

CLONE_NEW_FLAGS: dict[str, int] = {
    "CLONE_NEWTIME": 0x00000080, "CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000, "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000, "CLONE_NEWNET": 0x40000000,
}
_TIOCSTI, _TIOCLINUX = 0x5412, 0x541C  # push input into a terminal; --new-session already stops the former


@functools.cache
def filter_bpf() -> bytes:
    """The compiled filter (classic BPF for the native arch), built once per process."""
    import pyseccomp as sc

    flt = sc.SyscallFilter(defaction=sc.ALLOW)
    for name in DENIED:
        if _known(sc, name):
            flt.add_rule(sc.ERRNO(errno.EPERM), name)
    for flag in CLONE_NEW_FLAGS.values():
        flt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    for request in (_TIOCSTI, _TIOCLINUX):
        flt.add_rule(sc.ERRNO(errno.EPERM), "ioctl", sc.Arg(1, sc.MASKED_EQ, 0xFFFFFFFF, request))
    if _known(sc, "clone3"):
        flt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    fd = os.memfd_create("gymflow-seccomp", os.MFD_CLOEXEC)
    try:
        with open(fd, "rb", closefd=False) as handle:
            flt.export_bpf(handle)
            os.lseek(fd, 0, os.SEEK_SET)
            return handle.read()
    finally:
        os.close(fd)


def seccomp_unavailable() -> str | None:
    """None when the filter can be built here; else why not."""
    try:
        filter_bpf()
    except (ImportError, OSError, RuntimeError, ValueError) as err:
        return (f"the sandbox's syscall filter cannot be built ({type(err).__name__}: {err}); it needs the PyPI "
                "package pyseccomp and the Debian package libseccomp2")
    return None


def filter_fd() -> int:
    """A fresh memfd holding the filter, positioned at 0, for bwrap to read. The caller closes it."""
    fd = os.memfd_create("gymflow-seccomp", os.MFD_CLOEXEC)
    data = memoryview(filter_bpf())
    while data:
        data = data[os.write(fd, data):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _known(sc: object, name: str) -> bool:
    # An older libseccomp may not know the newest syscalls; such a kernel has none of them either.
    # (-1 is libseccomp's "unknown name"; other negative numbers are syscalls of other arches, which it skips.)
    try:
        return sc.resolve_syscall(sc.system_arch(), name) != -1  # type: ignore[attr-defined]
    except (ValueError, OSError):
        return False
