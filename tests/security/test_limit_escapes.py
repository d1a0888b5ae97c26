"""Escapes from the sandbox's limits (the syscall filter, capped filesystems, whole-sandbox cgroups), and
legitimate programs those limits used to break (threads, output of a slow teardown)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from gymflow.environments.code_gen import CodeGenEnvironment
from gymflow.environments.sandbox import BubblewrapSandbox, Limits, SandboxStatus, UnsandboxedRunner, cgroups, execution
from gymflow.environments.sandbox import report as report_module
from gymflow.environments.sandbox.cgroups import Probe

from tests.security import requires_bwrap

pytestmark = requires_bwrap

MIB = 1 << 20
LIMITS = Limits(wall_s=10, cpu_s=8, memory_bytes=256 * MIB, max_procs=16, tmpfs_bytes=8 * MIB,
                file_bytes=64 * MIB)

_CTYPES = """
import ctypes, errno, os
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
def call(name, *args):
    rc = getattr(LIBC, name)(*args)
    print(name, "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()])
    return rc
def sys_(label, nr, *args):
    rc = LIBC.syscall(nr, *args)
    if rc == 0 and label.startswith("clone"):
        os._exit(0)  # a child of a clone that should not have worked
    print(label, "ok" if rc >= 0 else errno.errorcode[ctypes.get_errno()])
"""


@pytest.fixture(scope="module")
def sb() -> BubblewrapSandbox:
    return BubblewrapSandbox()


@pytest.fixture(scope="module")
def with_cgroups(sb: BubblewrapSandbox) -> BubblewrapSandbox:
    if sb.cgroups is None:
        pytest.skip(f"no usable cgroups here: {cgroups.probe().reason}")
    return sb


def outcome(stdout: str) -> dict[str, str]:
    return dict(line.split(" ", 1) for line in stdout.splitlines() if " " in line)


# ---- the syscall filter ----------------------------------------------------------------------------


async def test_ptrace_of_a_sibling_is_denied(sb: BubblewrapSandbox) -> None:
    code = _CTYPES + """
import time
child = os.fork()
if child == 0:
    time.sleep(5)
    os._exit(0)
call("ptrace", 16, child, 0, 0)  # PTRACE_ATTACH: then it could run code there, outside its limits
call("ptrace", 0x4206, child, 0, 0)  # PTRACE_SEIZE
sys_("process_vm_readv", 310, child, 0, 0, 0, 0, 0)
os.kill(child, 9)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert outcome(result.stdout) == {"ptrace": "EPERM", "process_vm_readv": "EPERM"}


async def test_namespaces_and_mounts_are_denied(sb: BubblewrapSandbox) -> None:
    code = _CTYPES + """
call("unshare", 0x10000000 | 0x00020000)  # a nested user + mount namespace: root there, mounts allowed
call("unshare", 0x40000000)  # net
sys_("clone_newuser", 56, 0x10000000 | 17, 0, 0, 0, 0)  # clone(CLONE_NEWUSER | SIGCHLD)
sys_("clone_newpid", 56, 0x20000000 | 17, 0, 0, 0, 0)
sys_("setns", 308, 0, 0)
call("mount", b"none", b"/tmp", b"tmpfs", 0, None)
call("umount2", b"/tmp", 2)
sys_("pivot_root", 155, b"/tmp", b"/tmp")
sys_("clone3", 435, 0, 0)
pid = os.fork()  # plain fork and threads still work: glibc falls back from clone3 to clone
if pid == 0:
    os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    lines = result.stdout.splitlines()
    assert lines == ["unshare EPERM", "unshare EPERM", "clone_newuser EPERM", "clone_newpid EPERM", "setns EPERM",
                     "mount EPERM", "umount2 EPERM", "pivot_root EPERM", "clone3 ENOSYS", "fork 7"]


async def test_kernel_interfaces_are_denied(sb: BubblewrapSandbox) -> None:
    code = _CTYPES + """
sys_("keyctl", 250, 0, -3, 0)  # KEYCTL_GET_KEYRING_ID of the session keyring
sys_("add_key", 248, b"user", b"k", b"v", 1, -3)
sys_("request_key", 249, b"user", b"k", None, 0)
sys_("bpf", 321, 0, 0, 0)
sys_("perf_event_open", 298, 0, 0, -1, -1, 0)
sys_("userfaultfd", 323, 0)
sys_("io_uring_setup", 425, 1, 0)
sys_("init_module", 175, 0, 0, 0)
sys_("kexec_load", 246, 0, 0, 0, 0)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert set(outcome(result.stdout).values()) == {"EPERM"} and len(result.stdout.splitlines()) == 9


async def test_sysv_shared_memory_is_denied(sb: BubblewrapSandbox) -> None:
    # A segment outlives the processes that made it, outside every per-process limit.
    code = _CTYPES + """
call("shmget", 0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
call("msgget", 0, 0o1600)
call("semget", 0, 1, 0o1600)
import multiprocessing.shared_memory as sm  # POSIX shared memory: a file in the capped /dev/shm
seg = sm.SharedMemory(create=True, size=1 << 20)
seg.close(); seg.unlink()
print("posix_shm ok")
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert outcome(result.stdout) == {"shmget": "EPERM", "msgget": "EPERM", "semget": "EPERM", "posix_shm": "ok"}


# ---- filesystems -----------------------------------------------------------------------------------


async def test_every_writable_filesystem_is_capped(sb: BubblewrapSandbox) -> None:
    code = """
import os, stat
def fill(path):
    try:
        with open(path, "wb") as f:
            for _ in range(32):
                f.write(b"x" * (1 << 20))
                f.flush()
        return "WROTE 32 MiB"
    except OSError as e:
        return os.strerror(e.errno)
for path in ["/dev/big", "/dev/shm/big", "/tmp/big", "/sandbox/big"]:
    print(path, fill(path))
uncapped = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    target, opts, fstype, super_opts = fields[4], fields[5], fields[-3], fields[-1]
    if opts.startswith("rw") and fstype not in ("proc", "devpts") and not stat.S_ISCHR(os.stat(target).st_mode):
        if fstype != "tmpfs" or "size=" not in super_opts:
            uncapped.append(target)
print("uncapped", uncapped)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert outcome(result.stdout) == {"/dev/big": "Read-only file system", "/dev/shm/big": "No space left on device",
                                      "/tmp/big": "No space left on device",
                                      "/sandbox/big": "No space left on device", "uncapped": "[]"}


# ---- whole-sandbox cgroups -------------------------------------------------------------------------


async def test_memory_cap_binds_the_whole_sandbox(with_cgroups: BubblewrapSandbox) -> None:
    # 8 processes of 100 MiB each: every one is under its 256 MiB address-space limit, together 800 MiB.
    code = """
import os, time
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        block = bytearray(100 << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        time.sleep(2)
        os._exit(0)
    kids.append(pid)
print("exits", [os.waitpid(k, 0)[1] for k in kids])
"""
    result = await with_cgroups.run_python(code, limits=LIMITS)
    assert result.status is SandboxStatus.MEMORY, (result, result.stderr)
    assert result.wall_s < LIMITS.wall_s
    fits = await with_cgroups.run_python(code.replace("range(8)", "range(2)"), limits=LIMITS)
    assert fits.succeeded and fits.stdout == "exits [0, 0]\n"


async def test_task_cap_binds_the_whole_sandbox(with_cgroups: BubblewrapSandbox) -> None:
    # Processes and their threads together: the pids cgroup counts every task of the sandbox.
    code = """
import os, threading, time
started = 0
stop = threading.Event()
for _ in range(40):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        threads = 0
        for _ in range(10):
            try:
                threading.Thread(target=stop.wait, daemon=True).start()
                threads += 1
            except RuntimeError:
                break
        time.sleep(1.5)
        os._exit(threads)
    started += 1
tasks = 1 + started
for _ in range(started):
    tasks += os.wait()[1] >> 8
print(tasks)
"""
    limits = Limits(**{**LIMITS.__dict__, "max_procs": 12})
    result = await with_cgroups.run_python(code, limits=limits)
    assert result.succeeded, result.stderr
    assert 2 <= int(result.stdout) <= limits.max_procs


async def test_cgroups_are_removed_after_each_run(with_cgroups: BubblewrapSandbox) -> None:
    support = with_cgroups.cgroups
    assert support is not None
    await with_cgroups.run_python("import os\nfor _ in range(4):\n    os.fork() or __import__('time').sleep(60)",
                                  limits=Limits(**{**LIMITS.__dict__, "wall_s": 1.0}))
    mine = [p for base in {support.memory_base, support.pids_base} for p in base.glob(f"run-{os.getpid()}-*")]
    assert mine == []


def test_describe_limits_says_which_limits_bind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report_module, "probe", lambda: Probe(None, "no writable cgroup hierarchy"))
    fallback = report_module.describe_limits()
    assert "NO whole-sandbox caps" in fallback and "no writable cgroup hierarchy" in fallback
    assert "RLIMIT_AS" in fallback and "seccomp" in fallback
    monkeypatch.undo()
    if cgroups.probe().support is not None:
        assert "whole-sandbox memory and task caps by cgroup" in report_module.describe_limits()


# ---- legitimate programs ---------------------------------------------------------------------------

THREADS = """
import threading
done = threading.Barrier(65)
threads = [threading.Thread(target=done.wait) for _ in range(64)]
for t in threads:
    t.start()
done.wait()
for t in threads:
    t.join()
print("64 threads")
"""


@pytest.mark.parametrize("use_cgroups", [True, False], ids=["cgroups", "rlimits-only"])
async def test_64_threads_start_under_code_gen_limits(use_cgroups: bool) -> None:
    limits = CodeGenEnvironment()._limits("64 threads")  # 4 GiB, LiveCodeBench's 512 MiB stack
    result = await BubblewrapSandbox(cgroups=use_cgroups).run_python(THREADS, limits=limits)
    assert result.succeeded and result.stdout == "64 threads\n", result.stderr


async def test_a_timeout_after_filling_tmp_keeps_status_and_output(sb: BubblewrapSandbox) -> None:
    code = """
import sys
print("before", flush=True)
sys.stderr.write("progress\\n")
for i in range(5):  # 50 MiB in files of 10 (RLIMIT_FSIZE is 16 MiB)
    with open(f"/tmp/part{i}", "wb") as f:
        f.write(b"x" * (10 << 20))
print("wrote 50 MiB", flush=True)
while True:
    pass
"""
    limits = CodeGenEnvironment(timeout_s=1.5)._limits("")
    result = await sb.run_python(code, limits=limits)
    assert result.status is SandboxStatus.TIMEOUT
    assert result.stdout == "before\nwrote 50 MiB\n" and result.stderr == "progress\n"


async def test_output_read_before_a_slow_teardown_is_kept(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # A process outside the killed group keeps the pipes open past the teardown bound (possible without a
    # sandbox): what was read before must come back, not be dropped with the reader.
    monkeypatch.setattr(execution, "_TEARDOWN_S", 0.5)
    pidfile = tmp_path / "straggler.pid"
    code = f"""
import os, sys, time
print("kept", flush=True)
sys.stderr.write("kept too\\n"); sys.stderr.flush()
if os.fork() == 0:
    os.setsid()
    open({str(pidfile)!r}, "w").write(str(os.getpid()))
    time.sleep(30)
    os._exit(0)
while True:
    pass
"""
    start = time.monotonic()
    result = await UnsandboxedRunner().run_python(code, limits=Limits(wall_s=1.0, cpu_s=5))
    try:
        assert result.status is SandboxStatus.TIMEOUT and time.monotonic() - start < 5
        assert result.stdout == "kept\n" and result.stderr == "kept too\n"
    finally:
        for _ in range(50):
            if pidfile.exists() and pidfile.read_text():
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the pipes close now: let asyncio finish the transport
