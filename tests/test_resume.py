"""Resume inside an episode: a rollout failed by a model outage continues after the outage from the
step that failed; the steps that succeeded do not run again, and Postgres ends with one completed row."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from gymflow.testing.scripted_openai import http_error, text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task


async def test_resume_failed_rollout_from_the_failed_step(gf, scripted, sql, run_id, config_file):
    # Turn 0 and its tool call succeed; turn 1 meets an outage that outlasts every retry (4 attempts).
    scripted.script(tool_call("get_weather", {"city": "SF"}), *[http_error(503, "down")] * 4)
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    first = await gf.run_rollout(inp)
    assert first.status == "failed" and first.failure_type == "model_unavailable"
    assert sql("SELECT status FROM rollouts WHERE id = %s", inp.rollout_id) == [("failed",)]
    scripted.reset()
    scripted.script(text("It is cold."))  # the endpoint is back

    cmd = [sys.executable, "-m", "gymflow.cli.main", "resume", run_id, "--wait", "--config", str(config_file)]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, timeout=120,
                                   env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "completed" in proc.stdout

    assert len(scripted.requests) == 1, "only the failed generation ran again"
    assert scripted.requests[0].body["messages"][-1]["role"] == "tool", "it continued the same episode"
    rows = sql("SELECT status, reward, turns, tool_calls FROM rollouts WHERE run_id = %s", run_id)
    assert rows == [("completed", 1.0, 2, 1)]
    desc = await gf.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status.name == "COMPLETED"


async def test_resume_with_nothing_failed(gf, run_id, config_file):
    cmd = [sys.executable, "-m", "gymflow.cli.main", "resume", run_id, "--config", str(config_file)]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 0 and "no failed rollouts" in proc.stdout


async def _outcome(gf, workflow_id: str, run: str | None) -> str:
    from temporalio.client import WorkflowFailureError

    try:
        await asyncio.wait_for(gf.temporal.get_workflow_handle(workflow_id, run_id=run).result(), 60)
        return "completed"
    except WorkflowFailureError:
        return "failed"


async def test_resume_again_lists_each_failed_rollout_once_and_no_completed_one(gf, scripted, run_id):
    from gymflow.resume import failed_query, resume_run

    scripted.script(tool_call("get_weather", {"city": "SF"}), *[http_error(503, "down")] * 4)
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    assert (await gf.run_rollout(inp)).status == "failed"
    for _ in range(50):  # visibility is eventually consistent: the Failed index lags the close by a moment
        if (await gf.temporal.count_workflows(failed_query(run_id))).count:
            break
        await asyncio.sleep(0.1)

    scripted.script(*[http_error(503, "still down")] * 4)  # the first resume fails again
    first = await resume_run(gf.temporal, run_id, reason="test")
    assert [(r.workflow_id, r.note) for r in first] == [(inp.rollout_id, "resumed")]
    assert await _outcome(gf, inp.rollout_id, first[0].new_run_id) == "failed"

    scripted.script(text("It is cold."))
    second = await resume_run(gf.temporal, run_id, reason="test")  # two failed runs in visibility, listed once
    assert [(r.workflow_id, r.note) for r in second] == [(inp.rollout_id, "resumed")]
    assert await _outcome(gf, inp.rollout_id, second[0].new_run_id) == "completed"

    assert await resume_run(gf.temporal, run_id, reason="test") == [], "its latest run completed: nothing to resume"
