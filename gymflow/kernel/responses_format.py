"""NeMo Gym rows speak the OpenAI Responses API; gymflow speaks Chat Completions. Convert at the edge."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gymflow.kernel.errors import TaskError
from gymflow.kernel.wire import ChatMessage, FunctionCall, SamplingParams, ToolCall, ToolSpec

_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def validation_message(err: ValidationError, where: str) -> str:
    """A pydantic error as `where.field: message`, naming the first problem only."""
    first = err.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
    return f"{where}{loc}: {first['msg']}"


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskError(f"{where}.{key}: expected a string")
    return value


def _text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                raise TaskError(f"{where}.content[{i}]: expected a text part")
        return "".join(parts)
    raise TaskError(f"{where}.content: expected a string or a list of text parts")


def input_to_messages(inp: Any, where: str = "responses_create_params.input") -> list[ChatMessage]:
    """Responses `input` (a string or a list of items) -> chat messages."""
    if isinstance(inp, str):
        return [ChatMessage(role="user", content=inp)]
    if not isinstance(inp, list) or not inp:
        raise TaskError(f"{where}: expected a non-empty string or list")
    out: list[ChatMessage] = []
    for i, item in enumerate(inp):
        here = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise TaskError(f"{here}: expected an object")
        kind = item.get("type", "message")
        if kind == "message":
            raw_role = item.get("role", "")
            role = _ROLES.get(raw_role) if isinstance(raw_role, str) else None
            if role is None:
                raise TaskError(f"{here}.role: unknown role {item.get('role')!r}")
            out.append(ChatMessage(role=role, content=_text(item.get("content"), here)))
        elif kind == "function_call":
            name, args = item.get("name"), item.get("arguments", "{}")
            if not isinstance(name, str) or not name:
                raise TaskError(f"{here}.name: required (a string)")
            if not isinstance(args, str):
                raise TaskError(f"{here}.arguments: expected a JSON-encoded string")
            call_id = _optional_str(item, "call_id", here) or _optional_str(item, "id", here) or f"call_{i}"
            call = ToolCall(id=call_id, function=FunctionCall(name=name, arguments=args))
            if out and out[-1].role == "assistant" and out[-1].tool_calls is not None:
                prev = out.pop()
                call_list = (*prev.tool_calls, call)  # type: ignore[misc]
                out.append(prev.model_copy(update={"tool_calls": call_list}))
            else:
                out.append(ChatMessage(role="assistant", content=None, tool_calls=(call,)))
        elif kind == "function_call_output":
            output = item.get("output")
            out.append(ChatMessage(role="tool", tool_call_id=_optional_str(item, "call_id", here),
                                   content=output if isinstance(output, str) else json.dumps(output)))
        elif kind == "reasoning":
            continue
        else:
            raise TaskError(f"{here}.type: unsupported input item type {kind!r}")
    return out


def tool_to_spec(tool: Any, where: str) -> ToolSpec:
    """Accept a Responses-format function tool or a Chat Completions one."""
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise TaskError(f"{where}: only function tools are supported")
    fn = tool.get("function", tool)
    if not isinstance(fn, dict):
        raise TaskError(f"{where}.function: expected an object")
    if not isinstance(fn.get("name"), str) or not fn["name"]:
        raise TaskError(f"{where}.name: required")
    try:
        return ToolSpec(name=fn["name"], description=fn.get("description") or "",
                        parameters=fn.get("parameters") or {"type": "object", "properties": {}},
                        strict=fn.get("strict"))
    except ValidationError as e:
        raise TaskError(validation_message(e, where)) from None


def sampling_from(params: dict[str, Any], where: str = "responses_create_params") -> SamplingParams:
    try:
        return SamplingParams(temperature=params.get("temperature"), top_p=params.get("top_p"),
                              max_tokens=params.get("max_output_tokens") or params.get("max_tokens"),
                              seed=params.get("seed"))
    except ValidationError as e:
        first = e.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else ""
        if name == "max_tokens" and params.get("max_output_tokens"):
            name = "max_output_tokens"  # the Responses name, when the row used it
        raise TaskError(f"{where}.{name}: {first['msg']}") from None
