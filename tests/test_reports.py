"""The SQL views users query: mean reward and pass@k per run, failures by type, latency percentiles."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from gymflow.testing.scripted_openai import context_length_error, text, tool_call
from tests.conftest import ROOT
from tests.helpers import weather_task


async def test_views_and_report_command(gf, scripted, run_id, config_file):
    # task a: one success of two samples; task b: two zeros; task c: a typed failure (no reward).
    plan = [("a", 0, [tool_call("get_weather", {"city": "SF"}), text("cold")]), ("a", 1, [text("?")]),
            ("b", 0, [text("?")]), ("b", 1, [text("?")]), ("c", 0, [context_length_error()])]
    for task_id, sample, replies in plan:
        scripted.script(*replies)
        await gf.run_rollout(gf.make_input(run_id, weather_task(task_id), sample, "policy"))

    views = await gf.report(run_id)
    (scores,) = views["run_scores"]
    assert (scores["rollouts"], scores["completed"], scores["failed"], scores["masked"]) == (5, 4, 1, 0)
    assert scores["mean_reward"] == 0.25
    assert float(scores["pass_at_k"]) == 0.5  # a solved, b not; c never scored, so not counted
    assert [(f["failure_type"], f["n"]) for f in views["failure_counts"]] == [("context_length_exceeded", 1)]
    (lat,) = views["latency_percentiles"]
    assert 0 < lat["p50_s"] <= lat["p99_s"]

    cmd = [sys.executable, "-m", "gymflow.cli.main", "report", run_id, "--config", str(config_file)]
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, timeout=60,
                                   env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "run_scores" in proc.stdout and "context_length_exceeded" in proc.stdout and "0.25" in proc.stdout
