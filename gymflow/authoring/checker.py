"""`gymflow env check`: every row of a dataset through an environment, reported by line.

Per row: parse it (errors name line and field), `validate` (the gold answer must score 1.0), then a scripted
episode without Temporal through the same tool and verify code the activities run (`tool_result`, `score`):
the environment's `gold_turns` when it has them, else one call of each offered tool with arguments from its
schema and a plain answer. Last, a hostile reply (NUL bytes, junk) must be scored, not crash the verifier or
mask the rollout. Every environment call has a timeout.

An installed environment (the registry's own instance, as `gymflow env check` passes) runs in the workers'
supervised processes (activities/env_processes.py), killed at the timeout: `asyncio.wait_for` cannot interrupt
synchronous code, such as a row's regex that backtracks for ever. Only the steps its worker runs in the event
loop (`runs_in_loop`, `in_loop_reason`) run here, under `wait_for`; so does any other instance (a test's).
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from gymflow.activities.env_calls import score, tool_result
from gymflow.activities.env_processes import EnvProcesses, Limits, RemoteError, RemoteTraceback
from gymflow.authoring.schema_args import example_value
from gymflow.data.datasets import DatasetError, ErrorLog, duplicate, iter_tasks
from gymflow.environments.base import Environment, Step, VerifyContext
from gymflow.environments.registry import entry_point_value, environment_at, get_environment
from gymflow.kernel.errors import GymflowError, TaskError, VerifierError
from gymflow.kernel.failures import VERIFIER_TIMEOUT
from gymflow.kernel.wire import (
    JSON,
    ChatMessage,
    FunctionCall,
    Score,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
    not_run_message,
)

R = TypeVar("R")

DEFAULT_TIMEOUT_S = 60.0  # one environment call (code_gen's verify runs programs for tens of seconds)
DEFAULT_MAX_TURNS = 16
_MESSAGE_CHARS = 300
CHECK_PROCESSES = 2  # calls run one at a time; the second is ready when the first is killed
HOSTILE_REPLY = "\x00" * 8 + "{[(" * 200 + "\\boxed{" + "\ufffd é 🙂 " * 50 + "```python\n" + "\x00" * 8


class CheckFailed(Exception):
    """One row failed a step; the message says which and why."""


@dataclass
class LineResult:
    line: int  # 0: about the file as a whole
    ok: bool
    message: str


@dataclass
class CheckReport:
    path: str
    results: list[LineResult] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)

    def lines(self) -> list[str]:
        """One line per result, `path:line: ok|error ...`, in line order."""
        out = []
        for r in sorted(self.results, key=lambda r: r.line):
            where = f"{self.path}:{r.line}" if r.line else self.path
            out.append(f"{where}: {'ok' if r.ok else 'error'}: {r.message}")
        return out


def _short(text: str) -> str:
    """One printable line: row values and model-facing errors are quoted in messages."""
    text = " ".join(text.replace("\x00", "\\x00").split())
    return text if len(text) <= _MESSAGE_CHARS else text[: _MESSAGE_CHARS - 1] + "…"


def _finding(stage: str, e: Exception, timeout_s: float, sync: bool) -> CheckFailed:
    """This row's error for what environment code raised; `sync`: a plain call, where a TaskError names its field."""
    if not sync and isinstance(e, TimeoutError):
        return CheckFailed(f"{stage}: timed out after {timeout_s:g} s")
    if sync and isinstance(e, TaskError):
        return CheckFailed(str(e))
    if not sync and isinstance(e, GymflowError):
        return CheckFailed(f"{stage}: {e} ({e.failure_type})")
    what = "" if isinstance(e, RemoteError) else f"{type(e).__name__}: "  # a RemoteError's text names its class
    return CheckFailed(f"{stage}: crashed: {what}{e}")  # plug-in code: any crash is this row's finding


async def _bounded(work: Awaitable[R], stage: str, timeout_s: float) -> R:
    """Await environment code with a timeout; its crashes become this row's error, naming the stage."""
    try:
        return await asyncio.wait_for(work, timeout_s)
    except Exception as e:
        raise _finding(stage, e, timeout_s, sync=False) from None


def _sync(stage: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as e:
        raise _finding(stage, e, 0, sync=True) from None


# ---- environment code, by stage: module-level, so that it travels to a supervised process by name ----------


_child_loop: asyncio.AbstractEventLoop | None = None  # one per supervised process, as its own calls have


def _in_child(name: str, value: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    """In a supervised process (`EnvProcesses.run`): `fn(env, *args)`, the environment as the worker loads it."""
    global _child_loop
    out = fn(environment_at(name, value), *args)
    if not inspect.iscoroutine(out):
        return out
    _child_loop = _child_loop or asyncio.new_event_loop()
    return _child_loop.run_until_complete(out)


def _parse(env: Environment, task: Task) -> None:
    env.parse_task(task)


async def _validate(env: Environment, task: Task) -> Score | None:
    return await env.validate(task)


def _gold_turns(env: Environment, task: Task) -> list[ChatMessage] | None:
    turns = env.gold_turns(task, env.parse_task(task))
    return None if turns is None else list(turns)


def _tools(env: Environment, task: Task) -> tuple[ToolSpec, ...]:
    return tuple(env.tools(task, env.parse_task(task)))


def _initial_messages(env: Environment, task: Task) -> list[ChatMessage]:
    return list(env.initial_messages(task, env.parse_task(task)))


def _setup(env: Environment, task: Task) -> JSON:
    return env.setup(task, env.parse_task(task))


async def _tool(env: Environment, task: Task, state: JSON, call: ToolCall) -> ToolResult:
    return await tool_result(env, task, env.parse_task(task), state, call)


async def _verify(env: Environment, task: Task, messages: list[ChatMessage], state: JSON, options: JSON) -> Score:
    return await score(env, env.parse_task(task), messages, state, VerifyContext("scripted", options=options))


class _Calls:
    """Runs one row's environment code: in a supervised process, killed at the timeout, or here where the worker
    runs that step in its loop (or without `processes`), under `wait_for`."""

    def __init__(self, env: Environment, task: Task, processes: EnvProcesses | None, timeout_s: float) -> None:
        self.env, self.task, self.processes, self.timeout_s = env, task, processes, timeout_s
        self.options: JSON = {"setup_timeout_s": timeout_s, "tool_timeout_s": timeout_s,
                              "verify_timeout_s": timeout_s}
        self.limits = Limits(tool_s=timeout_s, verify_s=timeout_s, setup_s=timeout_s)
        self.value = entry_point_value(env.name) if processes is not None else ""

    def isolated(self, step: Step | None) -> bool:
        """`step` None (validate): isolated unless the environment runs in the loop at all."""
        if self.processes is None:
            return False
        if step is None:
            return self.env.in_loop_reason is None
        return not self.env.runs_in_loop(self.task, self.options, step)

    async def __call__(self, stage: str, step: Step | None, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(env, task, *args)`, bounded; whatever ends it early is this row's `CheckFailed`, naming `stage`."""
        sync = not inspect.iscoroutinefunction(fn)
        if self.processes is None or not self.isolated(step):
            if sync:
                return _sync(stage, fn, self.env, self.task, *args)
            return await _bounded(fn(self.env, self.task, *args), stage, self.timeout_s)
        try:
            return await self.processes.run(_in_child, (self.env.name, self.value, fn, (self.task, *args)),
                                            self.limits, self.task)
        except VerifierError as e:
            if isinstance(e.__cause__, RemoteTraceback):  # the environment's own, raised again here
                raise _finding(stage, e, self.timeout_s, sync) from None
            if e.failure_type == VERIFIER_TIMEOUT:  # its process was killed at the limit
                raise CheckFailed(f"{stage}: timed out after {self.timeout_s:g} s") from None
            raise CheckFailed(f"{stage}: {str(e).removeprefix(_in_child.__name__ + ' ')}") from None  # memory, died
        except Exception as e:
            raise _finding(stage, e, self.timeout_s, sync) from None

    async def verify(self, stage: str, messages: list[ChatMessage], state: JSON) -> Score:
        if self.isolated("verify"):
            return await self(stage, "verify", _verify, messages, state, self.options)
        # As the worker: in the loop, its CPU-bound checks (`run_isolated`) in a supervised process. Imported
        # here: a supervised process imports this module within a call's limit, and this one pulls in Temporal.
        from gymflow.activities.env_activities import verify_episode

        ctx = VerifyContext("scripted", options=self.options)
        return await _bounded(verify_episode(self.env, None, messages, state, ctx, self.task, self.processes), stage,
                              self.timeout_s)


def scripted_turns(tools: Sequence[ToolSpec]) -> list[ChatMessage]:
    """No gold answer: call every offered tool once, with arguments from its schema, then answer."""
    turns = []
    if tools:
        calls = tuple(ToolCall(id=f"check-{i}", function=FunctionCall(
            name=t.name, arguments=json.dumps(example_value(t.parameters) or {}))) for i, t in enumerate(tools))
        turns.append(ChatMessage(role="assistant", tool_calls=calls))
    turns.append(ChatMessage(role="assistant", content="Done."))
    return turns


async def _episode(calls: _Calls, turns: Sequence[ChatMessage], max_turns: int
                   ) -> tuple[list[ChatMessage], JSON, list[str]]:
    """Play `turns` as the model; tools run as the workflow runs them. Returns messages, state, tool errors."""
    task = calls.task
    state = await calls("setup", "setup", _setup)
    try:
        json.dumps(state)
    except (TypeError, ValueError) as e:
        raise CheckFailed(f"setup: the state is not JSON-serialisable ({e})") from None
    messages = list(await calls("initial_messages", "setup", _initial_messages))
    tool_errors: list[str] = []
    for turn, reply in enumerate(turns):
        if turn >= min(max_turns, task.max_turns or max_turns):
            break
        if not isinstance(reply, ChatMessage) or reply.role != "assistant":
            raise CheckFailed(f"gold_turns: turn {turn + 1} is not an assistant ChatMessage")
        messages.append(reply)
        ended_by: str | None = None
        for call in reply.tool_calls or ():
            if ended_by is not None:
                messages.append(not_run_message(call, ended_by))
                continue
            res = await calls(f"tool {call.function.name!r}", "tool", _tool, state, call)
            messages.append(res.message)
            state = res.state
            if res.is_error:
                tool_errors.append(_short(f"{call.function.name}: {res.message.text}")[:120])
            if res.done:
                ended_by = call.function.name
        if not reply.tool_calls or ended_by is not None:
            break
    return messages, state, tool_errors


def _check_reward(score: Score, stage: str) -> float:
    if score.masked:
        raise CheckFailed(f"{stage}: masked ({score.failure_type}): {score.details.get('error', '')}")
    reward = score.reward
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not 0.0 <= reward <= 1.0:
        raise CheckFailed(f"{stage}: reward {reward!r} is not a number in [0, 1]")
    return float(reward)


async def check_task(env: Environment, task: Task, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_turns: int = DEFAULT_MAX_TURNS, processes: EnvProcesses | None = None) -> str:
    """Check one row; returns the summary of a passing row, raises `CheckFailed` otherwise. With `processes`,
    `env` must be the registry's instance (they load it by its entry point)."""
    calls = _Calls(env, task, processes, timeout_s)
    await calls("parse_task", "setup", _parse)
    notes = []
    gold_score = await calls("validate", None, _validate)
    if gold_score is None:
        notes.append("no gold answer to validate")
    elif (gold := _check_reward(gold_score, "validate")) != 1.0:
        details = _short(json.dumps(gold_score.details, default=str))
        raise CheckFailed(f"validate: the gold answer scored {gold:g}, not 1 ({details})")
    else:
        notes.append("validate 1")

    gold_turns = await calls("gold_turns", "setup", _gold_turns)
    tools = await calls("tools", "setup", _tools)
    turns = list(gold_turns) if gold_turns else scripted_turns(tools)
    messages, state, tool_errors = await _episode(calls, turns, max_turns)
    reward = _check_reward(await calls.verify("verify", messages, state), "verify")
    kind = "gold episode" if gold_turns else f"scripted episode ({len(tools)} tools called)" if tools else \
        "scripted episode (no tools)"
    if gold_turns and reward != 1.0:
        raise CheckFailed(f"verify: the {kind} scored {reward:g}, not 1")
    notes.append(f"{kind} reward {reward:g}")
    if tool_errors:  # arguments from a schema may name no real record: reported, not a failure
        notes.append(f"{len(tool_errors)} tool calls answered an error (first: {tool_errors[0]})")

    hostile = [*await calls("initial_messages", "setup", _initial_messages),
               ChatMessage(role="assistant", content=HOSTILE_REPLY)]
    state = await calls("setup", "setup", _setup)
    hostile_score = await calls.verify("verify (hostile reply)", hostile, state)
    _check_reward(hostile_score, "verify of a hostile reply (it must be scored, not masked)")
    return "; ".join(notes)


def _installed(env: Environment) -> bool:
    """The registry's own instance: a supervised process builds the same one from its entry point."""
    try:
        return get_environment(env.name) is env
    except Exception:  # not installed (a test's instance): checked in-process
        return False


async def check_file(env: Environment, path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_turns: int = DEFAULT_MAX_TURNS) -> CheckReport:
    """Every line of `path` through `env`; parse errors name line and field."""
    report = CheckReport(str(path))
    errors = ErrorLog(str(path))
    seen: dict[str, int] = {}
    processes = EnvProcesses(CHECK_PROCESSES) if _installed(env) else None
    try:
        if processes is not None:
            processes.start()
        for row, task in iter_tasks(path, env=env.name, errors=errors):
            if problem := duplicate(seen, task.id, row.line):
                errors.add(DatasetError(str(path), row.line, problem))
                continue
            try:
                summary = await check_task(env, task, timeout_s=timeout_s, max_turns=max_turns, processes=processes)
            except CheckFailed as e:
                report.results.append(LineResult(row.line, False, _short(str(e))))
            else:
                report.results.append(LineResult(row.line, True, _short(summary)))
    finally:
        if processes is not None:
            await processes.close()
    report.results += [LineResult(e.line, False, e.message) for e in errors.errors]
    return report
