"""One tool call and one verify, in-process: what a supervised environment process (activities/env_child.py) runs,
and what the worker runs itself for an environment that stays in its event loop. No Temporal, no store, no
metrics here: this module is imported by every supervised process."""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

from gymflow.environments.base import Environment, TaskData, ToolOutput, VerifyContext

from gymflow.kernel.errors import ToolError, VerifierError
from gymflow.kernel.failures import known
from gymflow.kernel.wire import JSON, ChatMessage, Score, Task, ToolCall, ToolResult

# A tool's output goes to the model and into workflow history: cap it, and say so to the model.
MAX_TOOL_OUTPUT_CHARS = 100_000
# Tool arguments are the model's: bounded before they are parsed. 1 M characters is the longest reply
# (limits.max_reply_chars); 64 levels is deeper than any tool schema, and shallow enough that the copies, pickles
# and JSONB encodings the arguments go through later never recurse past Python's limit.
MAX_ARGUMENT_CHARS = 1_000_000
MAX_ARGUMENT_DEPTH = 64


def tool_message(call: ToolCall, content: str) -> ChatMessage:
    if len(content) > MAX_TOOL_OUTPUT_CHARS:
        cut = len(content) - MAX_TOOL_OUTPUT_CHARS
        content = f"{content[:MAX_TOOL_OUTPUT_CHARS]}\n[output truncated: {cut} more characters]"
    return ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name, content=content)


def tool_error(call: ToolCall, state: JSON, text: str) -> ToolResult:
    """A call the model should see fail: its state is unchanged."""
    return ToolResult(message=tool_message(call, f"Error: {text}"), state=state, is_error=True)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_ARGUMENT_DEPTH:
                return depth
            stack.extend((v, depth + 1) for v in (node.values() if isinstance(node, dict) else node))
    return deepest


class _NonFinite(ValueError):
    pass


def _no_constant(name: str) -> Any:
    # Python's json takes NaN and Infinity; JSON (and Postgres' jsonb, where the tool's message and state go) does not.
    raise _NonFinite(name)


def parse_arguments(raw: str) -> dict[str, Any]:
    if len(raw) > MAX_ARGUMENT_CHARS:
        raise ToolError(f"arguments are {len(raw)} characters long, over the limit of {MAX_ARGUMENT_CHARS}")
    try:
        args = json.loads(raw, parse_constant=_no_constant) if raw.strip() else {}
    except _NonFinite as e:
        raise ToolError(f"arguments hold {e}, which is not a JSON number (use a finite number or a string)") from None
    except json.JSONDecodeError as e:
        raise ToolError(f"arguments are not valid JSON ({e.msg} at column {e.colno}): {raw[:200]}") from None
    except RecursionError:  # the C parser gives up at Python's recursion limit
        raise ToolError(f"arguments nested too deep (more than {MAX_ARGUMENT_DEPTH} levels)") from None
    if not isinstance(args, dict):
        raise ToolError("arguments must be a JSON object")
    if _depth(args) > MAX_ARGUMENT_DEPTH:
        raise ToolError(f"arguments nested too deep (more than {MAX_ARGUMENT_DEPTH} levels)")
    return args


def ends_episode(env: Environment, task: Task, data: TaskData, name: str, out: ToolOutput) -> bool:
    """Whether a successful call ends the episode: the environment said so, or the tool is a terminal one."""
    return bool(out.done) or name in env.terminal_tools(task, data)


async def tool_result(env: Environment, task: Task, data: TaskData, state: JSON, call: ToolCall,
                      offered: Collection[str] | None = None) -> ToolResult:
    """One tool call: a bad call (unknown tool, bad arguments, ToolError) becomes an error message for the model
    with the state unchanged; a good one may end the episode. Anything else the environment raises propagates.
    `offered`: the names the episode offered, where the environment discovered some (`discover_tools`)."""
    name = call.function.name
    available = set(offered) if offered is not None else {t.name for t in env.tools(task, data)}
    try:
        if name not in available:
            raise ToolError(f"unknown tool {name!r}; available: {', '.join(sorted(available)) or 'none'}")
        args = parse_arguments(call.function.arguments)
        out = await env.call_tool(data, dict(state), name, args)
    except ToolError as e:
        return tool_error(call, state, str(e))
    return ToolResult(message=tool_message(call, out.content), state=out.state,
                      done=ends_episode(env, task, data, name, out))


async def score(env: Environment, data: TaskData, messages: Sequence[ChatMessage], state: JSON,
                ctx: VerifyContext) -> Score:
    """The environment's verdict; an unscorable episode is masked, never scored 0."""
    try:
        return await env.verify(data, messages, state, ctx)
    except VerifierError as e:
        return Score(reward=None, masked=True, failure_type=known(e.failure_type), details={"error": str(e)})
