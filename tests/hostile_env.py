"""A test environment whose tools and verifier misbehave as hostile model input can make real ones misbehave:
spin in pure Python, sleep, allocate gigabytes, print without end, exit the process, backtrack on a regex. It runs
in the supervised environment processes (activities/env_processes.py) like any in-process environment; they load
it by its entry point's value, so installing it in the test process (`hostile_env` fixture) is enough.

Tools: `echo` (its `text`, NUL bytes included; records it in the state), `spin`, `sleep` (`seconds`), `alloc`
(`gb` gigabytes), `print` (forever, to stdout and stderr), `exit` (os._exit), `regex` (Python's `re` on
`pattern`), `raise` (an unexpected error). Task fields: `verify` and `setup` pick a fault there ("hang", "spin",
"alloc", "exit", "raise"); unset, verify scores 1 when `echo` was called.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest
from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools

from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec
from tests.faulty_env import TRACEBACK_TEXT, _install

NAME = "hostile_test_env"
ENTRY_POINT = EntryPoint(name=NAME, value="tests.hostile_env:HostileEnvironment", group="gymflow.environments")
TOOLS = tuple(ToolSpec(name=n, description=n, parameters={"type": "object", "properties": {}})
              for n in ("echo", "spin", "sleep", "alloc", "print", "exit", "regex", "raise"))
CATASTROPHIC = "(.*)*(.*)*Q"  # the pattern that froze a workflow worker: exponential for Python's `re`


class HostileTask(TaskData):
    verify: str | None = None
    setup: str | None = None


def misbehave(how: str | None) -> None:
    if how == "hang":
        time.sleep(3600)
    elif how == "spin":
        while True:
            pass
    elif how == "alloc":
        blocks = [bytearray(1 << 30) for _ in range(8)]  # 8 GB, over any cap a test sets
        del blocks
    elif how == "exit":
        os._exit(7)
    elif how == "raise":
        raise RuntimeError(TRACEBACK_TEXT)


class HostileEnvironment(Environment[HostileTask]):
    name = NAME
    task_type = HostileTask
    placement = "local"  # as the environment that froze a workflow worker was

    def tools(self, task: Task, data: HostileTask) -> Sequence[ToolSpec]:
        return TOOLS

    def setup(self, task: Task, data: HostileTask) -> JSON:
        misbehave(data.setup)
        return {"echoed": []}

    async def call_tool(self, data: HostileTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        if name == "echo":
            text = str(args.get("text", ""))
            return ToolOutput(content=text, state={**state, "echoed": [*state.get("echoed", []), text]})
        if name == "sleep":
            time.sleep(float(args.get("seconds", 3600)))  # blocking, as careless tool code is
            return ToolOutput(content="slept", state=state)
        if name == "print":
            while True:
                print("x" * 4096)
                print("y" * 4096, file=sys.stderr)
        if name == "regex":
            found = re.search(str(args.get("pattern", CATASTROPHIC)), "a" * 40 + "@example.com")
            return ToolOutput(content=str(bool(found)), state=state)
        misbehave({"spin": "spin", "alloc": "alloc", "exit": "exit", "raise": "raise"}[name])
        return ToolOutput(content="survived", state=state)

    async def verify(self, data: HostileTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        misbehave(data.verify)
        return Score(reward=1.0 if "echo" in called_tools(messages) else 0.0, details={"pid": os.getpid()})


def hostile_task(task_id: str = "h0", text: str = "go", **data: object) -> Task:
    return Task(id=task_id, env=NAME, messages=(ChatMessage(role="user", content=text),), data=dict(data))


@pytest.fixture(scope="session")
def hostile_env() -> str:
    return _install(NAME, ENTRY_POINT)
