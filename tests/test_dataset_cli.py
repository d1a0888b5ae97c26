"""`gymflow collect` on a dataset with bad lines: errors name file and line; valid lines still run."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.helpers import WEATHER_DATASET


async def test_malformed_line_is_reported_and_the_rest_runs(gf, scripted, sql, run_id, config_file, tmp_path):
    good = WEATHER_DATASET.read_text().splitlines()[:2]
    bad_row = json.dumps({"responses_create_params": {"tools": []}})  # no input
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good[0], '{"responses_create_params": {"input": "unterminated', bad_row, good[1]]))
    cmd = [sys.executable, "-m", "gymflow.cli.main", "collect", str(path), "--env", "single_tool", "-n", "1",
           "--run-id", run_id, "--config", str(config_file)]
    env = {**os.environ, "COLUMNS": "200"}
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                                   timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"{path}:2: invalid JSON" in out
    assert f"{path}:3: responses_create_params.input: required" in out
    assert sql("SELECT task_id, status FROM rollouts WHERE run_id = %s ORDER BY task_id", run_id) == [
        ("mixed-1", "completed"), ("mixed-4", "completed")]
    (errors,) = sql("SELECT dataset_errors FROM runs WHERE id = %s", run_id)[0]
    assert len(errors) == 2 and errors[0].startswith(f"{path}:2:")
    assert "mean reward" in out
