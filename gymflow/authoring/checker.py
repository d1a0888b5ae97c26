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

from gymflow.activities.env_activities import verify_episode
from gymflow.activities.env_calls import score, tool_result
from gymflow.activities.env_processes import EnvProcesses, Limits, RemoteError, RemoteTraceback
from gymflow.authoring.schema_args import example_value
from gymflow.data.datasets import DatasetError, ErrorLog, duplicate, iter_tasks
from gymflow.environments.base import Environment, Step, VerifyContext
from gymflow.environments.registry import entry_point_value, environment_at, get_environment
from gymflow.kernel.errors import GymflowError, TaskError, VerifierError
from gymflow.kernel.failures import VERIFIER_TIMEOUT
from gymflow.kernel.wire import JSON, ChatMessage, FunctionCall, Score, Task, ToolCall, ToolSpec, not_run_message

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


async def _bounded(work: Awaitable[R], stage: str, timeout_s: float) -> R:
    """Await environment code with a timeout; its crashes become this row's error, naming the stage."""
    try:
        return await asyncio.wait_for(work, timeout_s)
    except TimeoutError:
        raise CheckFailed(f"{stage}: timed out after {timeout_s:g} s") from None
    except GymflowError as e:
        raise CheckFailed(f"{stage}: {e} ({e.failure_type})") from None
    except Exception as e:  # plug-in code: any crash is this row's finding
        raise CheckFailed(f"{stage}: crashed: {type(e).__name__}: {e}") from None


def _sync(stage: str, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except TaskError as e:
        raise CheckFailed(str(e)) from None
    except Exception as e:
        raise CheckFailed(f"{stage}: crashed: {type(e).__name__}: {e}") from None


def scripted_turns(tools: Sequence[ToolSpec]) -> list[ChatMessage]:
    """No gold answer: call every offered tool once, with arguments from its schema, then answer."""
    turns = []
    if tools:
        calls = tuple(ToolCall(id=f"check-{i}", function=FunctionCall(
            name=t.name, arguments=json.dumps(example_value(t.parameters) or {}))) for i, t in enumerate(tools))
        turns.append(ChatMessage(role="assistant", tool_calls=calls))
    turns.append(ChatMessage(role="assistant", content="Done."))
    return turns


async def _episode(env: Environment, task: Task, data: TaskData, turns: Sequence[ChatMessage],
                   timeout_s: float, max_turns: int) -> tuple[list[ChatMessage], JSON, list[str]]:
    """Play `turns` as the model; tools run as the workflow runs them. Returns messages, state, tool errors."""
    state = _sync("setup", env.setup, task, data)
    try:
        json.dumps(state)
    except (TypeError, ValueError) as e:
        raise CheckFailed(f"setup: the state is not JSON-serialisable ({e})") from None
    messages = list(_sync("initial_messages", env.initial_messages, task, data))
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
            res = await _bounded(run_tool_call(env, task, data, state, call), f"tool {call.function.name!r}",
                                 timeout_s)
            messages.append(res.message)
            state = res.state
            if res.is_error:
                tool_errors.append(_short(f"{call.function.name}: {res.message.content}")[:120])
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
                     max_turns: int = DEFAULT_MAX_TURNS) -> str:
    """Check one row; returns the summary of a passing row, raises `CheckFailed` otherwise."""
    data = _sync("parse_task", env.parse_task, task)
    notes = []
    gold_score = await _bounded(env.validate(task), "validate", timeout_s)
    if gold_score is None:
        notes.append("no gold answer to validate")
    elif (gold := _check_reward(gold_score, "validate")) != 1.0:
        details = _short(json.dumps(gold_score.details, default=str))
        raise CheckFailed(f"validate: the gold answer scored {gold:g}, not 1 ({details})")
    else:
        notes.append("validate 1")

    gold_turns = _sync("gold_turns", env.gold_turns, task, data)
    tools = _sync("tools", env.tools, task, data)
    turns = list(gold_turns) if gold_turns else scripted_turns(tools)
    messages, state, tool_errors = await _episode(env, task, data, turns, timeout_s, max_turns)
    ctx = VerifyContext(policy_model="scripted")
    score = await _bounded(verify_episode(env, data, messages, state, ctx), "verify", timeout_s)
    reward = _check_reward(score, "verify")
    kind = "gold episode" if gold_turns else f"scripted episode ({len(tools)} tools called)" if tools else \
        "scripted episode (no tools)"
    if gold_turns and reward != 1.0:
        raise CheckFailed(f"verify: the {kind} scored {reward:g}, not 1")
    notes.append(f"{kind} reward {reward:g}")
    if tool_errors:  # arguments from a schema may name no real record: reported, not a failure
        notes.append(f"{len(tool_errors)} tool calls answered an error (first: {tool_errors[0]})")

    hostile = [*_sync("initial_messages", env.initial_messages, task, data),
               ChatMessage(role="assistant", content=HOSTILE_REPLY)]
    state = _sync("setup", env.setup, task, data)
    hostile_score = await _bounded(verify_episode(env, data, hostile, state, ctx), "verify (hostile reply)",
                                   timeout_s)
    _check_reward(hostile_score, "verify of a hostile reply (it must be scored, not masked)")
    return "; ".join(notes)


async def check_file(env: Environment, path: str | Path, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                     max_turns: int = DEFAULT_MAX_TURNS) -> CheckReport:
    """Every line of `path` through `env`; parse errors name line and field."""
    report = CheckReport(str(path))
    errors = ErrorLog(str(path))
    seen: dict[str, int] = {}
    for row, task in iter_tasks(path, env=env.name, errors=errors):
        if problem := duplicate(seen, task.id, row.line):
            errors.add(DatasetError(str(path), row.line, problem))
            continue
        try:
            summary = await check_task(env, task, timeout_s=timeout_s, max_turns=max_turns)
        except CheckFailed as e:
            report.results.append(LineResult(row.line, False, _short(str(e))))
        else:
            report.results.append(LineResult(row.line, True, _short(summary)))
    report.results += [LineResult(e.line, False, e.message) for e in errors.errors]
    return report
