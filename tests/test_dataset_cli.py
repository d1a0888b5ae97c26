"""`gymflow collect` on a dataset with bad lines: errors name file and line; valid lines still run."""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import subprocess
import sys

from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from tests.conftest import ROOT
from tests.helpers import WEATHER_DATASET


async def test_malformed_line_is_reported_and_the_rest_runs(gf, scripted, sql, run_id, config_file, tmp_path):
    good = WEATHER_DATASET.read_text().splitlines()[:2]
    bad_row = json.dumps({"responses_create_params": {"tools": []}})  # no input
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([good[0], '{"responses_create_params": {"input": "unterminated', bad_row, good[1]]))
    cmd = [sys.executable, "-m", "gymflow.cli.main", "collect", str(path), "--env", "single_tool", "-n", "1",
           "--run-id", run_id, "--config", str(config_file)]
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}  # a pipe, as in a log file
    proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, env=env,
                                   timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # The progress line whole: off a terminal rich would cut it at 80 columns (`mean rew…`).
    progress = next(line for line in out.splitlines() if "2/2" in line)
    assert re.search(r"mean reward \d\.\d{3} \d+:\d\d:\d\d$", progress) and "…" not in progress, progress
    assert f"{path}:2: invalid JSON" in out
    assert f"{path}:3: responses_create_params.input: required" in out
    assert sql("SELECT task_id, status FROM rollouts WHERE run_id = %s ORDER BY task_id", run_id) == [
        ("mixed-1", "completed"), ("mixed-4", "completed")]
    (errors,) = sql("SELECT dataset_errors FROM runs WHERE id = %s", run_id)[0]
    assert len(errors) == 2 and errors[0].startswith(f"{path}:2:")
    assert "mean reward" in out


async def test_hostile_rows_are_reported_and_the_rest_is_collected(gf, settings, sql, run_id, tmp_path):
    """The rows that once aborted a whole `collect` (Temporal's 2 MB payload and id limits) or made Postgres
    refuse a write are now lines in the report, and the good rows around them run."""
    good = [json.dumps({"id": f"ok{i}", "responses_create_params": {"input": "hi"}}).encode() for i in range(3)]
    path = tmp_path / "hostile.jsonl"
    path.write_bytes(b"\n".join([
        good[0],
        json.dumps({"id": "big", "responses_create_params": {"input": "x" * (3 << 20)}}).encode(),
        json.dumps({"id": "d" * 2000, "responses_create_params": {"input": "hi"}}).encode(),
        json.dumps({"id": "nul", "responses_create_params": {"input": "a\u0000b"}}).encode(),
        b'{"id": "utf8", "responses_create_params": {"input": "\xff"}}',
        json.dumps({"id": None, "responses_create_params": {"input": "hi"}}).encode(),
        good[1],
        good[1],
        good[2],
    ]) + b"\n")
    output = io.StringIO()
    await collect_dataset(settings, str(path), env="single_tool", model="policy", n=1, run_id=run_id,
                          console=Console(file=output, width=1000))
    printed = output.getvalue()
    for line, message in [(2, "row: 3,145,7"), (3, "id: 2,000 bytes; at most 200"),
                          (4, "responses_create_params.input: contains a NUL character"),
                          (5, "not valid UTF-8"), (6, "id: expected a string or an integer, got null"),
                          (8, "id: 'ok1' repeats line 7")]:
        assert f"{path}:{line}: {message}" in printed, printed
    assert sql("SELECT task_id, status FROM rollouts WHERE run_id = %s ORDER BY task_id", run_id) == [
        ("ok0", "completed"), ("ok1", "completed"), ("ok2", "completed")]
