"""The sandbox corpus: hostile programs must end within their limits, with the expected status, and leave
the host untouched. Needs bubblewrap (CI installs the Debian package)."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from gymflow.environments import sandbox as sandbox_module
from gymflow.environments.sandbox import (
    NOBODY,
    BubblewrapSandbox,
    Limits,
    SandboxStatus,
    SandboxUnavailable,
    UnsandboxedRunner,
    get_sandbox,
)

# Small limits keep the whole corpus to a few seconds.
LIMITS = Limits(wall_s=3.0, cpu_s=2, memory_bytes=256 << 20, max_procs=8, output_bytes=1 << 20,
                file_bytes=1 << 20, tmpfs_bytes=8 << 20)
SLACK_S = 1.5  # start-up and kill time allowed past a limit


@pytest.fixture(scope="module")
def sb() -> BubblewrapSandbox:
    if shutil.which("bwrap") is None:
        pytest.skip("needs bubblewrap (apt-get install bubblewrap; CI installs it)")
    return BubblewrapSandbox()


@pytest.fixture
def host_dir() -> Iterator[Path]:
    """A world-writable, world-readable directory outside /tmp, so only the sandbox can keep code out."""
    parent = next((p for p in ("/var/tmp", str(Path.home())) if os.access(p, os.W_OK)), None)
    path = Path(tempfile.mkdtemp(prefix="gymflow-sandbox-test-", dir=parent))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _other_test_processes() -> set[int]:
    """Under pytest-xdist, the other workers (our siblings below the controller): their sandboxes are theirs."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return set()
    return {c.pid for c in psutil.Process(os.getppid()).children()} - {os.getpid()}


def _belongs_to(proc: psutil.Process, pids: set[int]) -> bool:
    try:
        return any(parent.pid in pids for parent in proc.parents())
    except psutil.Error:
        return False


def leftover_sandbox_processes() -> list[psutil.Process]:
    """Live processes started by a sandbox bootstrap (they carry its command line), anywhere on the machine (an
    escaped one is reparented away from us) but below another xdist worker of this run."""
    found, others = [], _other_test_processes()
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "runpy.run_path('main.py'" in cmdline and proc.info["status"] != psutil.STATUS_ZOMBIE \
                and not _belongs_to(proc, others):
            found.append(proc)
    return found


async def test_check_and_plain_run(sb: BubblewrapSandbox) -> None:
    await sb.check()
    ok = await sb.run_python("import sys\nprint(sys.stdin.read()[::-1])", "olleh", limits=LIMITS)
    assert (ok.status, ok.exit_code, ok.stdout) == (SandboxStatus.OK, 0, "hello\n")
    failed = await sb.run_python("raise ValueError('boom')", limits=LIMITS)
    assert (failed.status, failed.exit_code) == (SandboxStatus.OK, 1) and "ValueError: boom" in failed.stderr
    exited = await sb.run_python("import sys\nsys.exit(3)", limits=LIMITS)
    assert (exited.status, exited.exit_code) == (SandboxStatus.OK, 3)


async def test_files_and_large_stdin(sb: BubblewrapSandbox) -> None:
    data = "x" * (5 << 20)
    code = "import sys\nprint(len(sys.stdin.read()), open('extra.txt').read())"
    result = await sb.run_python(code, data, files={"extra.txt": "side file"}, limits=LIMITS)
    assert result.stdout == f"{len(data)} side file\n"
    ignored = await sb.run_python("print('did not read')", data, limits=LIMITS)  # broken pipe is fine
    assert ignored.succeeded


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop applies only when running as root")
async def test_root_runs_the_sandbox_as_nobody(sb: BubblewrapSandbox) -> None:
    result = await sb.run_python("import os\nprint(os.getuid())", limits=LIMITS)
    assert result.stdout == f"{NOBODY}\n"


async def test_network_is_unreachable(sb: BubblewrapSandbox) -> None:
    abstract = f"\0gymflow-test-{uuid.uuid4().hex}"
    with socket.socket() as server, socket.socket(socket.AF_UNIX) as unix_server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.setblocking(False)
        unix_server.bind(abstract)
        unix_server.listen()
        unix_server.setblocking(False)
        port = server.getsockname()[1]
        code = f"""
import socket
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 53), ("8.8.8.8", 443)]:
    try:
        socket.create_connection((host, port), timeout=1).close()
        print("CONNECTED", host)
    except OSError as e:
        print("blocked", host, type(e).__name__)
try:
    s = socket.socket(socket.AF_UNIX)
    s.connect({abstract!r})
    print("CONNECTED unix")
except OSError as e:
    print("blocked unix", type(e).__name__)
try:
    socket.getaddrinfo("example.com", 80)
    print("RESOLVED")
except OSError:
    print("blocked dns")
"""
        result = await sb.run_python(code, limits=LIMITS)
        assert result.succeeded, result.stderr
        assert "CONNECTED" not in result.stdout and "RESOLVED" not in result.stdout
        assert result.stdout.count("blocked") == 5
        for listener in (server, unix_server):  # nothing reached the host's listeners
            with pytest.raises(BlockingIOError):
                listener.accept()


async def test_cannot_read_host_files(sb: BubblewrapSandbox, host_dir: Path) -> None:
    token = uuid.uuid4().hex
    secret = host_dir / "secret.txt"
    secret.write_text(token)
    secret.chmod(0o644)  # readable by anyone: only the mount namespace may hide it
    repo_file = Path(__file__).resolve()
    code = f"""
import os
for path in [{str(secret)!r}, "/proc/1/root" + {str(secret)!r}, {str(repo_file)!r}, "/etc/hostname", "/root/.bashrc"]:
    try:
        print("READ", path, open(path).read()[:200])
    except OSError as e:
        print("denied", path, type(e).__name__)
try:
    print("LISTED", os.listdir({str(host_dir)!r}))
except OSError as e:
    print("denied listing", type(e).__name__)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert token not in result.stdout + result.stderr
    assert "READ" not in result.stdout and "LISTED" not in result.stdout


async def test_cannot_write_outside_its_tmpfs(sb: BubblewrapSandbox, host_dir: Path) -> None:
    keep = host_dir / "keep.txt"
    keep.write_text("original")
    keep.chmod(0o666)  # writable by anyone: only the sandbox may protect it
    host_tmp_name = f"/tmp/gymflow-sandbox-{uuid.uuid4().hex}"
    targets = [str(keep), str(host_dir / "new.txt"), "/usr/pwned", "/etc/pwned", "/pwned", "/proc/pwned"]
    code = f"""
for path in {targets!r}:
    try:
        with open(path, "w") as f:
            f.write("pwned")
        print("WROTE", path)
    except OSError as e:
        print("denied", path, type(e).__name__)
for path in ["scratch.txt", {host_tmp_name!r}]:  # its own tmpfs: allowed, and private
    with open(path, "w") as f:
        f.write("fine")
    print("private", path)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert "WROTE" not in result.stdout and result.stdout.count("private") == 2
    assert keep.read_text() == "original"
    assert sorted(p.name for p in host_dir.iterdir()) == ["keep.txt"]
    assert not Path(host_tmp_name).exists() and not Path("/usr/pwned").exists() and not Path("/pwned").exists()


async def test_file_size_and_tmpfs_are_capped(sb: BubblewrapSandbox) -> None:
    code = """
for path, size in [("/tmp/big", 2 << 20)]:
    try:
        open(path, "wb").write(b"x" * size)
        print("WROTE big")
    except OSError as e:
        print("big", e.strerror)
try:
    for i in range(20):
        open(f"/tmp/part{i}", "wb").write(b"x" * (900 << 10))
    print("FILLED tmpfs")
except OSError as e:
    print("tmpfs", e.strerror)
"""
    result = await sb.run_python(code, limits=LIMITS)
    assert result.succeeded, result.stderr
    assert "big File too large" in result.stdout and "tmpfs No space left on device" in result.stdout


async def test_fork_bomb_is_bounded_and_ends_in_time(sb: BubblewrapSandbox) -> None:
    counted = await sb.run_python("""
import os, time
n = 0
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print(n)
""", limits=LIMITS)
    assert counted.succeeded and 0 < int(counted.stdout) < LIMITS.max_procs  # RLIMIT_NPROC held
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    limits = Limits(**{**LIMITS.__dict__, "wall_s": 2.0})
    result = await sb.run_python(bomb, limits=limits)
    assert result.status is SandboxStatus.TIMEOUT
    assert result.wall_s < limits.wall_s + SLACK_S
    await asyncio.sleep(0.2)
    assert leftover_sandbox_processes() == []  # the sleepers and the bomb died with the pid namespace


async def test_allocating_10_gb_hits_the_memory_limit(sb: BubblewrapSandbox) -> None:
    at_once = await sb.run_python("x = bytearray(10 * 1024 ** 3)", limits=LIMITS)
    assert at_once.status is SandboxStatus.MEMORY and at_once.wall_s < LIMITS.wall_s
    gradual = await sb.run_python("x = []\nwhile True:\n    x.append(b'x' * (1 << 20))", limits=LIMITS)
    assert gradual.status is SandboxStatus.MEMORY and gradual.wall_s < LIMITS.wall_s


async def test_infinite_loop_hits_the_wall_clock(sb: BubblewrapSandbox) -> None:
    limits = Limits(**{**LIMITS.__dict__, "wall_s": 1.0, "cpu_s": 30})
    result = await sb.run_python("while True:\n    pass", limits=limits)
    assert result.status is SandboxStatus.TIMEOUT
    assert limits.wall_s <= result.wall_s < limits.wall_s + SLACK_S


async def test_infinite_loop_hits_the_cpu_limit(sb: BubblewrapSandbox) -> None:
    limits = Limits(**{**LIMITS.__dict__, "wall_s": 30.0, "cpu_s": 1})
    result = await sb.run_python("while True:\n    pass", limits=limits)
    assert result.status is SandboxStatus.TIMEOUT and result.signal == 24  # SIGXCPU
    assert result.wall_s < limits.cpu_s + SLACK_S + 1


async def test_printing_1_gb_hits_the_output_cap(sb: BubblewrapSandbox) -> None:
    start = time.monotonic()
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"
    result = await sb.run_python(code, limits=LIMITS)
    assert result.status is SandboxStatus.OUTPUT_LIMIT and result.stdout_truncated
    assert len(result.stdout) == LIMITS.output_bytes
    flood = await sb.run_python(code.replace("stdout", "stderr"), limits=LIMITS)
    assert flood.status is SandboxStatus.OUTPUT_LIMIT and len(flood.stderr) <= LIMITS.stderr_bytes
    assert time.monotonic() - start < LIMITS.wall_s


async def test_cancelling_a_run_kills_its_sandbox(sb: BubblewrapSandbox) -> None:
    # A run cancelled at any point, even right after the spawn, must not leave its sandbox behind.
    limits = Limits(**{**LIMITS.__dict__, "wall_s": 30.0, "cpu_s": 30})
    for delay in (0.0, 0.005, 0.02, 0.3):
        task = asyncio.create_task(sb.run_python("import sys\nsys.stdin.read()\nwhile True:\n    pass", limits=limits))
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.2)
    assert leftover_sandbox_processes() == []


def test_missing_bwrap_is_a_clear_error_unless_opted_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no bwrap on PATH
    monkeypatch.delenv(sandbox_module.UNSAFE_ENV, raising=False)
    with pytest.raises(SandboxUnavailable, match="bubblewrap") as err:
        get_sandbox()
    assert sandbox_module.UNSAFE_ENV in str(err.value)
    with pytest.raises(SandboxUnavailable, match="apt-get install bubblewrap"):
        BubblewrapSandbox()
    assert isinstance(get_sandbox(allow_unsandboxed=True), UnsandboxedRunner)
    monkeypatch.setenv(sandbox_module.UNSAFE_ENV, "1")
    assert isinstance(get_sandbox(), UnsandboxedRunner)


async def test_unsandboxed_runner_keeps_timeout_and_output_cap() -> None:
    runner = UnsandboxedRunner()
    assert not runner.isolated
    echo = await runner.run_python("print(input())", "hi\n", limits=LIMITS)
    assert (echo.status, echo.stdout) == (SandboxStatus.OK, "hi\n")
    loop = await runner.run_python("while True:\n    pass", limits=Limits(**{**LIMITS.__dict__, "wall_s": 0.5}))
    assert loop.status is SandboxStatus.TIMEOUT
    flood = await runner.run_python("while True:\n    print('x' * 1000)", limits=LIMITS)
    assert flood.status is SandboxStatus.OUTPUT_LIMIT
