"""Sandboxed runs leave no zombie processes, even on a host whose pid 1 never reaps (no `init: true`).

bwrap's outer process exits before its pid-namespace init, so each run orphaned the init. The test runs
sandboxes under a stand-in for such a pid 1: a parent that is a child subreaper (orphans come to it
rather than to the real pid 1) and never reaps anything but the runner itself."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")

ZOMBIES = textwrap.dedent("""
    import os

    def zombie_children():
        me, found = os.getpid(), []
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{d}/stat").read()
            except OSError:
                continue
            state, ppid = stat[stat.rfind(")") + 2:].split()[:2]
            if state == "Z" and int(ppid) == me:
                found.append(d)
        return found
""")

RUNNER = ZOMBIES + textwrap.dedent("""
    import asyncio, time
    from gymflow.environments.sandbox import Limits, get_sandbox

    async def main():
        sb = get_sandbox()
        programs = [("print(1)", Limits()), ("while True: pass", Limits(wall_s=1, cpu_s=5)),
                    ("import os, time\\nif os.fork() == 0:\\n    time.sleep(30)\\nprint(1)", Limits())]
        for source, limits in programs * 3:
            await sb.run_python(source, limits=limits)
        time.sleep(0.5)
        print("runner zombies:", len(zombie_children()))

    asyncio.run(main())
""")

# A pid 1 that never reaps: orphans of its descendants come to it (subreaper) and stay zombies.
HOST = ZOMBIES + textwrap.dedent("""
    import ctypes, subprocess, sys, time
    assert ctypes.CDLL(None).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    runner = subprocess.run([sys.executable, "-c", sys.argv[1]], capture_output=True, text=True)
    print(runner.stdout + runner.stderr[-2000:])
    time.sleep(0.5)
    print("host zombies:", len(zombie_children()))
""")


def test_sandboxed_runs_leave_no_zombies():
    done = subprocess.run([sys.executable, "-c", HOST, RUNNER], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    out = done.stdout + done.stderr
    assert "runner zombies: 0" in out, out
    assert "host zombies: 0" in out, out  # 9 before the fix: one bwrap init per run
