"""Test-only environments, registered in-process by their fixtures: `faulty_env` (below) and `ending_env`
(an environment that ends episodes, further down).

The faulty environment misbehaves on request.

Task fields pick the fault: `fail_in` ("setup", "verify") raises an unexpected multi-line error there,
`mask` makes verify unscorable, `slow_s` makes tools and verify take that long. Tools: `echo` (returns its
`text` argument as it is, NUL bytes included), `boom` (raises an unexpected error), `sleep` (slow_s), `blob`
(returns `size` bytes, at most 1 MB: a large tool output from a small call), `zombie` (its first attempt
outlives its start-to-close timeout, ignoring cancellation, and then answers: a zombie attempt's late write).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from importlib.metadata import EntryPoint

import pytest
from gymflow.environments import registry
from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools
from temporalio import activity

from gymflow.kernel.errors import ToolError, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

NAME = "faulty_test_env"
ENTRY_POINT = EntryPoint(name=NAME, value="tests.faulty_env:FaultyEnvironment", group="gymflow.environments")
_OBJECT = {"type": "object", "properties": {"text": {"type": "string"}}}
ZOMBIE_S = 5.0  # how long the zombie tool's first attempt runs
ZOMBIES_RETURNED: list[object] = []  # a zombie's task data, once it has returned (this process's env pool)
TOOLS = tuple(ToolSpec(name=n, description=n, parameters=_OBJECT) for n in ("echo", "boom", "sleep", "blob", "zombie"))
# Multi-line, like a chained traceback: only the first line may reach the record.
TRACEBACK_TEXT = "the environment broke\nTraceback (most recent call last):\n  File \"x.py\", line 1"


class FaultyTask(TaskData):
    fail_in: str | None = None
    mask: bool = False
    slow_s: float = 0.0


class FaultyEnvironment(Environment[FaultyTask]):
    name = NAME
    task_type = FaultyTask
    # Its faults are the worker's to handle (timeouts, zombies): the zombie tool reads the activity's attempt and
    # reports to this process. The supervised processes get their own hostile environment (tests/hostile_env.py).
    in_loop_reason = "tests the worker's own timeouts; its zombie tool reads activity.info()"

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
        if name == "zombie":
            attempt = activity.info().attempt
            if attempt == 1:
                await _outlive_cancellation(ZOMBIE_S)
                ZOMBIES_RETURNED.append(data)
            return ToolOutput(content=f"answered by attempt {attempt}", state=state)
        if name == "blob":
            return ToolOutput(content="z" * min(int(args.get("size", 0)), 1 << 20), state=state)
        return ToolOutput(content=str(args.get("text", "")), state=state)

    async def verify(self, data: FaultyTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        await asyncio.sleep(data.slow_s)
        if data.fail_in == "verify":
            raise ValueError(TRACEBACK_TEXT)
        if data.mask:
            raise VerifierError("cannot score this\nsecond line")
        return Score(reward=1.0 if "echo" in called_tools(messages) else 0.0)


async def _outlive_cancellation(seconds: float) -> None:
    """Sleep `seconds` even if cancelled meanwhile, as code that never checks for cancellation would."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds
    while (left := end - loop.time()) > 0:
        try:
            await asyncio.sleep(left)
        except asyncio.CancelledError:
            continue


def faulty_task(task_id: str = "f0", text: str = "go", **data: object) -> Task:
    return Task(id=task_id, env=NAME, messages=(ChatMessage(role="user", content=text),), data=dict(data))


def _install(name: str, entry_point: EntryPoint) -> str:
    """Install a test environment in this process (where the test env pool runs), as an entry point would."""
    real = registry._entry_points
    registry._entry_points = lambda: {**real(), name: entry_point}
    try:
        registry.get_environment(name)  # cached from now on
    finally:
        registry._entry_points = real
    return name


@pytest.fixture(scope="session")
def faulty_env() -> str:
    return _install(NAME, ENTRY_POINT)


# ---- an environment that ends episodes (tests/test_episode_end.py) -------------------------------------

ENDING_NAME = "ending_test_env"
ENDING_ENTRY_POINT = EntryPoint(name=ENDING_NAME, value="tests.faulty_env:EndingEnvironment",
                                group="gymflow.environments")
ENDING_TOOLS = tuple(ToolSpec(name=n, description=n, parameters=_OBJECT)
                     for n in ("echo", "mark_task_complete", "submit"))


class EndingEnvironment(Environment[TaskData]):
    """`mark_task_complete` is a terminal tool; `submit` ends the episode by the environment's own rule (a
    non-empty `text`), and is a `ToolError` otherwise; `echo` records its text in the state. Verify reports
    what it saw: the tools called, the last message's role, the echoed texts."""

    name = ENDING_NAME
    task_type = TaskData

    def tools(self, task: Task, data: TaskData) -> Sequence[ToolSpec]:
        return ENDING_TOOLS

    def terminal_tools(self, task: Task, data: TaskData) -> set[str]:
        return {"mark_task_complete"}

    async def call_tool(self, data: TaskData, state: JSON, name: str, args: JSON) -> ToolOutput:
        text = str(args.get("text", ""))
        if name == "submit":
            if not text:
                raise ToolError("submit: `text` is required")
            return ToolOutput(content=f"submitted {text}", state={**state, "submitted": text}, done=True)
        if name == "mark_task_complete":
            return ToolOutput(content="marked complete", state=state)
        return ToolOutput(content=text, state={**state, "echoed": [*state.get("echoed", []), text]})

    async def verify(self, data: TaskData, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        called = called_tools(messages)
        ended = bool({"mark_task_complete", "submit"} & set(called))
        return Score(reward=1.0 if ended else 0.0, details={
            "called": called, "last_role": messages[-1].role, "echoed": state.get("echoed", []),
            "submitted": state.get("submitted")})


@pytest.fixture(scope="session")
def ending_env() -> str:
    return _install(ENDING_NAME, ENDING_ENTRY_POINT)


# ---- environments that answer turns without tool calls (tests/test_nemo_gym_gymnasium.py) ---------------

CONVERSING_NAME = "conversing_test_env"
CONVERSING_LOCAL_NAME = "conversing_local_test_env"


class ConversingEnvironment(Environment[TaskData]):
    """A scripted user: opens with "opening", answers each text turn "reply N", ends the episode at the third
    (`respond` done). Verify reports the roles it saw and the replies it counted in its state."""

    name = CONVERSING_NAME
    task_type = TaskData
    in_loop_reason = "test: no I/O"

    def responds(self, task: Task, data: TaskData) -> bool:
        return True

    async def open_episode(self, data: TaskData, state: JSON) -> tuple[list[ChatMessage], JSON]:
        return [ChatMessage(role="user", content="opening")], {**state, "replies": 0}

    async def respond(self, data: TaskData, state: JSON, messages: Sequence[ChatMessage]) -> ToolOutput:
        n = int(state.get("replies", 0)) + 1
        done = n >= 3
        return ToolOutput(content="" if done else f"reply {n}", state={**state, "replies": n,
                                                                       "heard": messages[-1].text}, done=done)

    async def verify(self, data: TaskData, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        return Score(reward=1.0 if state.get("replies") == 3 else 0.0,
                     details={"roles": [m.role for m in messages], "heard": state.get("heard")})


class ConversingLocalEnvironment(ConversingEnvironment):
    name = CONVERSING_LOCAL_NAME
    placement = "local"


CONVERSING_ENTRY_POINTS = {n: EntryPoint(name=n, value=f"tests.faulty_env:{c}", group="gymflow.environments")
                           for n, c in ((CONVERSING_NAME, "ConversingEnvironment"),
                                        (CONVERSING_LOCAL_NAME, "ConversingLocalEnvironment"))}


@pytest.fixture(scope="session")
def conversing_envs() -> list[str]:
    return [_install(n, e) for n, e in CONVERSING_ENTRY_POINTS.items()]


def install_all() -> None:
    """The test environments, for a worker process of the tests (tests/conftest.py, GeneratePool)."""
    from tests import rescore_env  # imports this module: loaded here, not at the top

    _install(NAME, ENTRY_POINT)
    _install(ENDING_NAME, ENDING_ENTRY_POINT)
    for name, entry_point in CONVERSING_ENTRY_POINTS.items():
        _install(name, entry_point)
    _install(rescore_env.NAME, rescore_env.ENTRY_POINT)
