"""Environment activities (CPU pool): episode setup, tool calls, verification."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from activities import metrics
from activities.boundary import heartbeating
from activities.model_client import ModelClients
from activities.recorded import RecordedJudge, recorded
from environments.base import ChatFn, Environment, TaskData, ToolOutput, VerifyContext
from gymflow.kernel.errors import ToolError, VerifierError
from gymflow.kernel.failures import known
from gymflow.kernel.wire import (
    JSON,
    ChatMessage,
    Score,
    Task,
    ToolCall,
    ToolResult,
)

# A tool's output goes to the model and into workflow history: cap it, and say so to the model.
MAX_TOOL_OUTPUT_CHARS = 100_000


def _tool_message(call: ToolCall, content: str) -> ChatMessage:
    if len(content) > MAX_TOOL_OUTPUT_CHARS:
        cut = len(content) - MAX_TOOL_OUTPUT_CHARS
        content = f"{content[:MAX_TOOL_OUTPUT_CHARS]}\n[output truncated: {cut} more characters]"
    return ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name, content=content)


def _parse_arguments(raw: str) -> dict[str, Any]:
    try:
        args = json.loads(raw) if raw.strip() else {}
    except json.JSONDecodeError as e:
        raise ToolError(f"arguments are not valid JSON ({e.msg} at column {e.colno}): {raw[:200]}") from None
    if not isinstance(args, dict):
        raise ToolError("arguments must be a JSON object")
    return args


def ends_episode(env: Environment, task: Task, data: TaskData, name: str, out: ToolOutput) -> bool:
    """Whether a successful call ends the episode: the environment said so, or the tool is a terminal one."""
    return bool(out.done) or name in env.terminal_tools(task, data)


async def run_tool_call(env: Environment, task: Task, data: TaskData, state: JSON, call: ToolCall) -> ToolResult:
    """One tool call, as both workflow shapes run it: a bad call (unknown tool, bad arguments, ToolError) becomes
    an error message for the model with the state unchanged; a good one may end the episode."""
    name = call.function.name
    available = {t.name for t in env.tools(task, data)}
    try:
        if name not in available:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(sorted(available)) or 'none'}")
        args = _parse_arguments(call.function.arguments)
        # Heartbeat while the tool runs: a killed env worker is noticed at the heartbeat timeout.
        out = await heartbeating(env.call_tool(data, dict(state), name, args))
    except ToolError as e:
        metrics.tool_call(task.env, "error")
        return ToolResult(message=_tool_message(call, f"Error: {e}"), state=state, is_error=True)
    metrics.tool_call(task.env, "ok")
    return ToolResult(message=_tool_message(call, out.content), state=out.state,
                      done=ends_episode(env, task, data, name, out))


async def verify_episode(env: Environment, data: TaskData, messages: Sequence[ChatMessage], state: JSON,
                         ctx: VerifyContext) -> Score:
    """The environment's verdict; an unscorable episode is masked, never scored 0."""
    try:
        # code_gen's verify runs programs for tens of seconds: heartbeat throughout.
        return await heartbeating(env.verify(data, messages, state, ctx))
    except VerifierError as e:
        return Score(reward=None, masked=True, failure_type=known(e.failure_type), details={"error": str(e)})


class EnvActivities:
    def __init__(self, sessions: async_sessionmaker, models: ModelClients | None = None,
                 env_options: dict[str, dict[str, Any]] | None = None) -> None:
        self._sessions = sessions
        self._models = models
        self._env_options = env_options or {}

    def _judge_chat(self, task_id: str) -> ChatFn | None:
        """A judge for one episode: live models by name, or a recorded model's recorded verdicts."""
        models = self._models
        if models is None:
            return None
        replays: dict[str, RecordedJudge] = {}

        async def chat(model: str, messages: Sequence[ChatMessage]) -> str:
            cfg = models.config(model)
            if cfg.recorded:
                replay = replays.setdefault(model, recorded(cfg.recorded).judge(task_id))
                return await replay(model, messages)
            return await models.chat(model, messages)

        return chat
