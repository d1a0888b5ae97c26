"""A test environment whose verifier can be changed between a collect and a rescore: the final reply scores 1 when
it is the option `accept` (default "yes"); each verify appends a line to the option `calls_log` (a file), so a test
counts how often an episode was verified."""

from __future__ import annotations

from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest
from gymflow.environments.base import (
    JSON,
    Environment,
    EnvironmentOptions,
    TaskData,
    VerifyContext,
    final_assistant_text,
)

from gymflow.kernel.wire import ChatMessage, Score
from tests.faulty_env import _install

NAME = "rescore_test_env"
ENTRY_POINT = EntryPoint(name=NAME, value="tests.rescore_env:RescoreEnvironment", group="gymflow.environments")


class RescoreOptions(EnvironmentOptions):
    accept: str = "yes"
    calls_log: str | None = None


class RescoreEnvironment(Environment[TaskData]):
    name = NAME
    task_type = TaskData
    Options = RescoreOptions

    async def verify(self, data: TaskData, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        if log := ctx.options.get("calls_log"):
            with open(log, "a") as f:
                f.write("verify\n")
        reply = (final_assistant_text(messages) or "").strip()
        return Score(reward=1.0 if reply == ctx.options.get("accept", "yes") else 0.0, details={"reply": reply})


@pytest.fixture(scope="session")
def rescore_env() -> str:
    return _install(NAME, ENTRY_POINT)
