"""`gymflow env check --timeout` holds on synchronous environment code: a row that makes it run for ever (an
instruction_following keyword that backtracks: once killed at 120 s despite `--timeout 5`) is that row's timeout,
in whichever stage runs it, and the rows beside it still pass. The check runs the environment in the workers'
supervised processes, killed at the limit; `asyncio.wait_for` alone cannot interrupt such code."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext
from gymflow.environments.registry import get_environment

from gymflow.authoring.checker import check_file
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec
from tests.faulty_env import _install

CATASTROPHIC = "(.*.*)*Q"  # exponential for Python's `re` on a few dozen characters with no Q
WITHIN_S = 15.0  # process starts, one kill and respawn per timed-out row, on a loaded 2-core box
NAME = "stalling_check_test_env"


class StallTask(TaskData):
    stall_in: str = ""  # the stage that never returns: validate, setup, tool or verify


def _stall(data: StallTask, stage: str) -> None:
    # Synchronous and endless, as careless code on a row's data; pure Python, so that pytest's timeout can still
    # end it without the fix (a C regex holds the GIL: only a kill ends it, see the CLI test below).
    while data.stall_in == stage:
        pass


class StallingEnvironment(Environment[StallTask]):
    name = NAME
    task_type = StallTask

    def tools(self, task: Task, data: StallTask) -> Sequence[ToolSpec]:
        return (ToolSpec(name="search", parameters={"type": "object", "properties": {}}),)

    def setup(self, task: Task, data: StallTask) -> JSON:
        _stall(data, "setup")
        return {}

    async def call_tool(self, data: StallTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        _stall(data, "tool")
        return ToolOutput(content="found", state=state)

    async def verify(self, data: StallTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        _stall(data, "verify")
        return Score(reward=1.0)

    async def validate(self, task: Task) -> Score:
        _stall(self.parse_task(task), "validate")
        return Score(reward=1.0)


@pytest.fixture(scope="module")
def stalling_env() -> Environment:
    _install(NAME, EntryPoint(name=NAME, value=f"{__name__}:StallingEnvironment", group="gymflow.environments"))
    return get_environment(NAME)


def _write(path: Path, rows: list[JSON]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.timeout(60)  # without the fix: ended by SIGALRM
def test_code_that_never_returns_in_any_stage_is_that_rows_timeout(stalling_env: Environment, tmp_path: Path) -> None:
    row = {"messages": [{"role": "user", "content": "go"}]}
    stages = ("validate", "setup", "tool", "verify")
    path = _write(tmp_path / "rows.jsonl", [row, *({**row, "stall_in": s} for s in stages)])
    start = time.monotonic()
    report = asyncio.run(check_file(stalling_env, path, timeout_s=1))
    assert time.monotonic() - start < WITHIN_S, report.lines()
    assert report.lines() == [
        f"{path}:1: ok: validate 1; scripted episode (1 tools called) reward 1",
        f"{path}:2: error: validate: timed out after 1 s",
        f"{path}:3: error: setup: timed out after 1 s",
        f"{path}:4: error: tool 'search': timed out after 1 s",
        f"{path}:5: error: verify: timed out after 1 s",
    ]


def test_an_instruction_following_keyword_that_backtracks_times_out(tmp_path: Path) -> None:
    """The row that ran for minutes, through the CLI: its keyword is matched against the hostile reply. In a
    subprocess, killed at its timeout: a regex in C holds the GIL, so nothing in this process could end it."""
    metadata = {"instruction_id_list": ["keywords:frequency"], "prompt": "Write a poem.",
                "kwargs": [{"keyword": "poem", "frequency": 1, "relation": "at least"}]}
    good = {"responses_create_params": {"input": "Write a poem."}, "verifier_metadata": metadata}
    bad = {**good, "verifier_metadata": {**metadata, "kwargs": [{**metadata["kwargs"][0], "keyword": CATASTROPHIC}]}}
    path = _write(tmp_path / "if.jsonl", [good, bad])
    cli = [sys.executable, "-m", "gymflow.cli.main", "env", "check", "instruction_following", str(path),
           "--timeout", "1"]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=WITHIN_S)  # raises past it: the bug
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.splitlines() == [
        f"{path}:1: ok: no gold answer to validate; scripted episode (no tools) reward 0",
        f"{path}:2: error: verify (hostile reply): timed out after 1 s",
        "2 lines: 1 ok, 1 failed",
    ]
