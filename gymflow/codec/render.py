"""A stored message as the UI shows it: role, content and tool calls, each capped so that one decoded
payload stays small whatever the model or a tool produced (the full text is in Postgres and `gymflow show`)."""

from __future__ import annotations

from typing import Any

from gymflow.kernel.wire import shown_content

CONTENT_CHARS = 2_000
ARGUMENT_CHARS = 500
TOOL_CALLS_SHOWN = 16


def cap(text: str, limit: int) -> str:
    """`text` cut at `limit` characters, saying how much was left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}[... {len(text) - limit} more]"


def _tool_call(call: Any) -> dict[str, Any]:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return {"name": None, "arguments": cap(str(call), ARGUMENT_CHARS)}
    arguments = function.get("arguments")
    arguments = arguments if isinstance(arguments, str) else str(arguments)
    return {"name": function.get("name"), "arguments": cap(arguments, ARGUMENT_CHARS)}


def summarize(role: str, body: Any) -> dict[str, Any]:
    """The summary of one message (Chat Completions shape in `body`); never its state or token data."""
    body = body if isinstance(body, dict) else {}
    out: dict[str, Any] = {"role": role}
    content = shown_content(body.get("content"))
    if content is not None:
        out["content"] = cap(content, CONTENT_CHARS)
    if isinstance(body.get("reasoning_content"), str):
        out["reasoning_content"] = cap(body["reasoning_content"], CONTENT_CHARS)
    calls = body.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [_tool_call(c) for c in calls[:TOOL_CALLS_SHOWN]]
        if len(calls) > TOOL_CALLS_SHOWN:
            out["tool_calls"].append(f"[... {len(calls) - TOOL_CALLS_SHOWN} more calls]")
    for key in ("tool_call_id", "name"):
        if isinstance(body.get(key), str):
            out[key] = cap(body[key], 200)
    return out
