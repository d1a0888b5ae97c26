"""Environment steps as the activities run them: episode setup, tool calls, verification, each in a supervised
process (activities/env_processes.py) unless the environment runs in the worker's loop (`in_loop_reason`)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from gymflow.activities import metrics
from gymflow.activities.boundary import heartbeating
from gymflow.activities.env_calls import score, tool_result
from gymflow.activities.env_processes import EnvProcesses, Limits
from gymflow.activities.model_client import ModelClients
from gymflow.activities.recorded import RecordedJudge, recorded
from gymflow.environments.base import ChatFn, Environment, TaskData, VerifyContext

from gymflow.kernel.wire import (
    JSON,
    ChatMessage,
    Score,
    Task,
    ToolCall,
    ToolResult,
    ToolSpec,
)


async def setup_episode(env: Environment, task: Task, processes: EnvProcesses | None = None,
                        options: JSON | None = None) -> tuple[list[ChatMessage], JSON, tuple[ToolSpec, ...]]:
    """(initial messages, initial state, tool schemas) of a new episode."""
    options = options or {}
    if processes is not None and processes.isolates(env, task, options, "setup"):
        return await processes.setup(task, Limits.from_options(options))
    data = env.parse_task(task)
    return list(env.initial_messages(task, data)), env.setup(task, data), tuple(env.tools(task, data))


async def run_tool_call(env: Environment, task: Task, data: TaskData | None, state: JSON, call: ToolCall,
                        processes: EnvProcesses | None = None, options: JSON | None = None,
                        offered: Collection[str] | None = None) -> ToolResult:
    """One tool call, as both workflow shapes run it: a bad call (unknown tool, bad arguments, ToolError, or one
    past its limits in its supervised process) becomes an error message for the model with the state unchanged; a
    good one may end the episode. `data` (the parsed task) is needed only to run it here, without `processes`."""
    options = options or {}
    # Heartbeat while the tool runs: a killed env worker is noticed at the heartbeat timeout.
    if processes is not None and processes.isolates(env, task, options, "tool"):
        res = await heartbeating(processes.tool(task, state, call, Limits.from_options(options)))
    else:
        res = await heartbeating(tool_result(env, task, data if data is not None else env.parse_task(task), state,
                                             call, offered))
    metrics.tool_call(task.env, "error" if res.is_error else "ok")
    return res


async def verify_episode(env: Environment, data: TaskData | None, messages: Sequence[ChatMessage], state: JSON,
                         ctx: VerifyContext, task: Task | None = None, processes: EnvProcesses | None = None
                         ) -> Score:
    """The environment's verdict; an unscorable episode (a verifier past its limits included) is masked, never
    scored 0. With `processes` and `task`, verify runs in a supervised process, or, for an environment that runs in
    the loop, there with `ctx.run_isolated` for its CPU-bound checks."""
    if processes is not None and task is not None:
        limits = Limits.from_options(ctx.options)
        if processes.isolates(env, task, ctx.options, "verify"):
            # code_gen-like verifiers run for tens of seconds: heartbeat throughout.
            return await heartbeating(processes.verify(task, messages, state, ctx.policy_model, ctx.options,
                                                       limits))

        async def isolated(fn: Any, *args: Any) -> Any:
            return await processes.run(fn, args, limits, task)

        ctx.run_isolated = isolated
    if data is None:
        if task is None:
            raise ValueError("verify_episode needs the task or its parsed data")
        data = env.parse_task(task)
    return await heartbeating(score(env, data, messages, state, ctx))


class EnvActivities:
    def __init__(self, models: ModelClients | None = None, env_options: dict[str, dict[str, Any]] | None = None
                 ) -> None:
        self._models = models
        self._env_options = env_options or {}

    def _judge_chat(self, task_id: str, sample: int = 0) -> ChatFn | None:
        """A judge for one episode: live models by name, or a recorded model's recorded verdicts."""
        models = self._models
        if models is None:
            return None
        replays: dict[str, RecordedJudge] = {}

        async def chat(model: str, messages: Sequence[ChatMessage]) -> str:
            cfg = models.config(model)
            if cfg.recorded:
                replay = replays.setdefault(model, recorded(cfg.recorded).judge(task_id, sample))
                return await replay(model, messages)
            return await models.chat(model, messages)

        return chat
