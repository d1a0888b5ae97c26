"""What a call's code might do to outlive or outgrow its supervised process (activities/env_processes.py,
activities/process_tree.py): processes it starts die with the call, in a session of their own or double-forked; the
memory cap it runs under cannot be raised from inside; a reply the worker cannot read (too large, a class only the
child has) fails that call typed and costs the worker nothing. Against real supervised processes."""

from __future__ import annotations

import asyncio
import os
import pickle
import resource
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from gymflow.activities.env_child import HEADER, MAX_REPLY_BYTES
from gymflow.activities.env_processes import EnvProcesses, Limits, UnreadableReply, _recv

from gymflow.kernel.errors import ConfigError, VerifierError
from gymflow.kernel.failures import VERIFIER_CRASHED, VERIFIER_TIMEOUT

LIMITS = Limits(verify_s=2.0, memory_mb=512)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def procs() -> AsyncIterator[EnvProcesses]:
    pool = EnvProcesses(2)
    pool.start()
    yield pool
    await pool.close()


# ---- what the calls do (module level: they travel to the supervised process by reference) ---------------------

def start_detached_then_hang(pid_file: str) -> None:
    """A child in a session of its own (setsid: not in our process group), then hang until killed."""
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path(pid_file).write_text(str(child.pid))
    time.sleep(3600)


def leave_a_daemon(pid_file: str) -> str:
    """A double-forked daemon (its parent exits at once, so it is an orphan), and a normal return."""
    subprocess.run(["sh", "-c", f"setsid sleep 600 >/dev/null 2>&1 & echo $! > {pid_file}"], check=True)
    return "done"


def memory_limits() -> tuple[int, int]:
    return resource.getrlimit(resource.RLIMIT_AS)


def raise_own_memory_cap() -> str:
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        return "refused"
    return "raised"


def reply_of_a_class_only_the_child_has(folder: str) -> object:
    Path(folder, "only_in_child.py").write_text("class Secret:\n    pass\n")
    sys.path.insert(0, folder)
    import only_in_child  # noqa: PLC0415 - exists only in this process

    return only_in_child.Secret()


def huge_reply() -> bytes:
    return b"x" * (MAX_REPLY_BYTES + 1)


# ---- helpers ------------------------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie is dead, only not yet reaped


async def _dead_soon(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _pid_from(path: Path) -> int:
    for _ in range(100):
        if path.exists() and path.read_text().strip():
            return int(path.read_text())
        await asyncio.sleep(0.05)
    raise AssertionError(f"no pid written to {path}")


# ---- tests ---------------------------------------------------------------------------------------------------

async def test_a_child_in_its_own_session_dies_with_a_timed_out_call(procs, tmp_path):
    pid_file = tmp_path / "child.pid"
    with pytest.raises(VerifierError) as err:
        await procs.run(start_detached_then_hang, (str(pid_file),), LIMITS)
    assert err.value.failure_type == VERIFIER_TIMEOUT
    pid = await _pid_from(pid_file)
    assert await _dead_soon(pid), f"process {pid} started by the call outlived its kill"


async def test_a_daemon_left_running_by_a_finished_call_is_killed(procs, tmp_path):
    pid_file = tmp_path / "daemon.pid"
    assert await procs.run(leave_a_daemon, (str(pid_file),), LIMITS) == "done"
    pid = await _pid_from(pid_file)
    assert await _dead_soon(pid), f"daemon {pid} outlived the call that started it"
    # the process that served it serves the next call
    assert await procs.run(memory_limits, (), LIMITS)


async def test_the_memory_cap_is_hard_and_cannot_be_raised_from_inside(procs):
    soft, hard = await procs.run(memory_limits, (), LIMITS)
    assert soft == hard == 512 << 20
    assert await procs.run(raise_own_memory_cap, (), LIMITS) == "refused"
    # a later call with a larger cap gets it (a fresh process where this one may not raise its own)
    bigger = Limits(verify_s=2.0, memory_mb=1024)
    assert await procs.run(memory_limits, (), bigger) == (1024 << 20, 1024 << 20)
    assert await procs.run(memory_limits, (), LIMITS) == (512 << 20, 512 << 20)


@pytest.mark.parametrize("mb", [0.5, 0, -1, 63])
def test_a_memory_cap_too_small_to_mean_anything_is_a_config_error(mb):
    with pytest.raises(ConfigError, match="memory_mb"):
        Limits.from_options({"memory_mb": mb})


async def test_a_reply_the_worker_cannot_unpickle_fails_that_call_typed(procs, tmp_path):
    with pytest.raises(VerifierError) as err:
        await procs.run(reply_of_a_class_only_the_child_has, (str(tmp_path),), LIMITS)
    assert err.value.failure_type == VERIFIER_CRASHED
    assert "cannot read" in str(err.value) and "only_in_child" in str(err.value)
    assert await procs.run(memory_limits, (), LIMITS)  # and the pool serves on


async def test_a_reply_over_the_limit_is_refused_in_the_child(procs):
    with pytest.raises(Exception, match=f"over {MAX_REPLY_BYTES}"):
        await procs.run(huge_reply, (), Limits(verify_s=10.0, memory_mb=1024))


@pytest.mark.parametrize(("frame", "refusal"), [
    (HEADER.pack(MAX_REPLY_BYTES + 1), "over"),  # refused from its header: the body is never read
    (HEADER.pack(6) + b"\x80\x04junk", "cannot read"),  # a truncated pickle
])
async def test_the_worker_reads_no_bad_frame_even_from_a_hijacked_child(frame, refusal):
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        theirs.sendall(frame)
        with pytest.raises(UnreadableReply, match=refusal):
            await asyncio.wait_for(_recv(asyncio.get_running_loop(), ours), 5)
    finally:
        ours.close()
        theirs.close()


async def test_a_good_frame_reads_back():
    ours, theirs = socket.socketpair()
    try:
        ours.setblocking(False)
        ok = pickle.dumps(("ok", 1))
        theirs.sendall(HEADER.pack(len(ok)) + ok)
        assert await asyncio.wait_for(_recv(asyncio.get_running_loop(), ours), 5) == ("ok", 1)
    finally:
        ours.close()
        theirs.close()


def test_no_process_of_these_tests_is_left(tmp_path):
    # belt and braces: nothing named "sleep 600" that a test here started survives in our tree
    mine = subprocess.run(["ps", "-o", "pid=,args=", "--ppid", str(os.getpid())], capture_output=True, text=True)
    assert "sleep 600" not in mine.stdout
