"""Tool calls for chat templates that know nothing of tools (SmolLM2's does not).

Such a template only renders `role` and `content`, so: the tool list goes into the system prompt as a short
description asking for a bare JSON object `{"name": ..., "arguments": {...}}`; an assistant turn that called
tools is rendered as that same JSON; and a reply that parses as such an object, naming an offered tool, becomes
a `tool_calls` entry. Anything else is plain text. Small models often fail the format; that is the model's
answer, to be scored, not an error.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.DOTALL)
_TAGS = re.compile(r"^<tool_call>\s*(.*?)\s*</tool_call>$", re.DOTALL)
MAX_CALL_CHARS = 100_000


def template_supports_tools(chat_template: str | None) -> bool:
    return bool(chat_template) and "tools" in chat_template


def tool_prompt(tools: list[dict[str, Any]]) -> str:
    specs = [{k: t["function"].get(k) for k in ("name", "description", "parameters") if t["function"].get(k)}
             for t in tools]
    return ("You can call these tools:\n" + "\n".join(json.dumps(s, ensure_ascii=False) for s in specs) +
            '\nTo call a tool, reply with only a JSON object: {"name": "<tool name>", "arguments": {...}}. '
            "Otherwise reply with plain text.")


def _call_text(call: dict[str, Any]) -> str:
    fn = call.get("function") if isinstance(call.get("function"), dict) else {}
    raw = fn.get("arguments")
    try:
        args = json.loads(raw) if isinstance(raw, str) else (raw or {})
    except ValueError:
        args = raw  # replay the model's own malformed arguments as they were
    return json.dumps({"name": fn.get("name"), "arguments": args}, ensure_ascii=False)


def render_messages(messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Messages as plain role/content pairs, with the tool description merged into the system prompt."""
    out = []
    for m in messages:
        content = m["content"]
        if m["tool_calls"]:
            content = "\n".join([content] * bool(content) + [_call_text(c) for c in m["tool_calls"]])
        out.append({"role": m["role"], "content": content})
    if tools:
        prompt = tool_prompt(tools)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def parse_tool_call(text: str, tools: list[dict[str, Any]]) -> dict[str, Any] | None:
    """An OpenAI `tool_calls` entry when `text` is exactly one JSON call of an offered tool, else None."""
    body = text.strip()
    if not tools or not body or len(body) > MAX_CALL_CHARS:
        return None
    for pattern in (_FENCE, _TAGS):
        match = pattern.match(body)
        if match:
            body = match.group(1)
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    names = {t["function"]["name"] for t in tools}
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    if not isinstance(args, dict):
        return None
    return {"id": f"call_{secrets.token_hex(8)}", "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(args, ensure_ascii=False)}}
