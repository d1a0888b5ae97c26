"""A test-only environment that misbehaves on request, registered for tests by `use_faulty_env`.

Task fields pick the fault: `fail_in` ("setup", "verify") raises an unexpected multi-line error there,
`mask` makes verify unscorable, `slow_s` makes tools and verify take that long. Tools: `echo` (returns its
`text` argument as it is, NUL bytes included), `boom` (raises an unexpected error), `sleep` (slow_s).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest

from environments import registry
from environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools
from gymflow.kernel.errors import VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

NAME = "faulty_test_env"
ENTRY_POINT = EntryPoint(name=NAME, value="tests.faulty_env:FaultyEnvironment", group="gymflow.environments")
_OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}
TOOLS = tuple(ToolSpec(name=n, description=n, parameters=_OBJECT) for n in ("echo", "boom", "sleep"))
# Multi-line, like a chained traceback: only the first line may reach the record.
TRACEBACK_TEXT = "the environment broke\nTraceback (most recent call last):\n  File \"x.py\", line 1"


class FaultyTask(TaskData):
    fail_in: str | None = None
    mask: bool = False
    slow_s: float = 0.0


class FaultyEnvironment(Environment[FaultyTask]):
    name = NAME
    task_type = FaultyTask

    def tools(self, task: Task, data: FaultyTask) -> Sequence[ToolSpec]:
        return TOOLS

    def setup(self, task: Task, data: FaultyTask) -> JSON:
        if data.fail_in == "setup":
            raise RuntimeError(TRACEBACK_TEXT)
        return {}

    async def call_tool(self, data: FaultyTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        if name == "boom":
            raise KeyError("boom")
        if name == "sleep":
            await asyncio.sleep(data.slow_s)
        return ToolOutput(content=str(args.get("text", "")), state=state)

    async def verify(self, data: FaultyTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        await asyncio.sleep(data.slow_s)
        if data.fail_in == "verify":
            raise ValueError(TRACEBACK_TEXT)
        if data.mask:
            raise VerifierError("cannot score this\nsecond line")
        return Score(reward=1.0 if "echo" in called_tools(messages) else 0.0)


def faulty_task(task_id: str = "f0", text: str = "go", **data: object) -> Task:
    return Task(id=task_id, env=NAME, messages=(ChatMessage(role="user", content=text),), data=dict(data))


@pytest.fixture(scope="session")
def faulty_env() -> str:
    """Install the faulty environment in this process (where the test env pool runs), as an entry point would."""
    real = registry._entry_points
    registry._entry_points = lambda: {**real(), NAME: ENTRY_POINT}
    try:
        registry.get_environment(NAME)  # cached from now on
    finally:
        registry._entry_points = real
    return NAME
