"""Ctrl-C typed at a terminal (tests/pty_run.py), as a person stops `gymflow worker` and `gymflow collect`: a quiet
stop within seconds, one line saying what keeps running, and a rerun of collect re-attaches to the same rollouts.
(`gymflow up` under a terminal: tests/test_up.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from gymflow.testing.scripted_openai import text, tool_call
from tests.conftest import ROOT
from tests.helpers import WEATHER_DATASET
from tests.pty_run import PtyProcess

pytestmark = pytest.mark.integration
QUIET = ("Traceback", "KeyboardInterrupt", "Aborted")


def test_worker_stops_quietly_on_ctrl_c(tmp_path, config_file, stack):
    # The generate queue of `judge`, which no test routes to a pool: this worker takes nobody else's work.
    term = PtyProcess([sys.executable, "-m", "gymflow.cli.main", "worker", "--pool", "generate", "--models", "judge",
                       "--config", str(config_file)], tmp_path / "worker.log", cwd=ROOT)
    term.wait_for("pool generate polling gymflow-generate-judge (Ctrl-C", 60)
    term.ctrl_c()
    sent = time.monotonic()
    code = term.wait(30)
    out = term.output()
    assert code == 0 and time.monotonic() - sent < 15, out
    assert not [w for w in QUIET if w in out], out
    assert "pool generate: stopping; in-flight calls finish first" in out, out
    assert out.rstrip().splitlines()[-1].startswith("pool generate stopped. Its rollouts are Temporal's"), out


async def test_collect_ctrl_c_then_rerun_reattaches(tmp_path, config_file, workers, scripted, sql):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(WEATHER_DATASET.read_text().splitlines()[0] + "\n")
    # The rollout is in flight when Ctrl-C comes.
    scripted.script(tool_call("get_weather", {"city": "SF"}, delay_s=4), text("cold"))
    run_id = f"ctrl-c-{time.time_ns()}"
    cmd = [sys.executable, "-m", "gymflow.cli.main", "collect", str(rows), "--env", "single_tool", "--model", "policy",
           "--run-id", run_id, "--config", str(config_file), "--no-probe"]
    # The workers run on this test's event loop: every wait here is awaited, never blocking it.
    term = PtyProcess(cmd, tmp_path / "collect.log", cwd=ROOT)
    deadline = time.monotonic() + 60
    while not sql(f"SELECT 1 FROM rollouts WHERE run_id = '{run_id}'"):  # started: its row exists
        assert term.proc.poll() is None and time.monotonic() < deadline, term.output()
        await asyncio.sleep(0.1)
    term.ctrl_c()
    code = await asyncio.to_thread(term.wait, 15)
    out = term.output()
    assert code == 130 and not [w for w in QUIET if w in out], out
    assert f"the rollouts of run {run_id!r} keep running in Temporal. Rerun to re-attach: gymflow collect" in out
    again = await asyncio.to_thread(subprocess.run, cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    stored = sql(f"SELECT status, count(*) FROM rollouts WHERE run_id = '{run_id}' GROUP BY status")
    assert [tuple(r) for r in stored] == [("completed", 1)], stored
