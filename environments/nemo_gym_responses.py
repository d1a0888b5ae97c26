"""gymflow's chat transcript -> the OpenAI Responses shapes a NeMo Gym resources server reads.

The reverse of gymflow/kernel/responses_format.py: the row's `responses_create_params` is rebuilt from the task
(the dataset loader keeps only the prompt, tools and sampling of it), and the episode after the prompt becomes the
`response` whose `output` items NeMo Gym's simple agent would have produced.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from gymflow.kernel.responses_format import content_to_input
from gymflow.kernel.wire import ChatMessage, Task, ToolSpec

JSON = dict[str, Any]


def tool_json(tool: ToolSpec) -> JSON:
    out: JSON = {"type": "function", "name": tool.name, "description": tool.description,
                 "parameters": tool.parameters}
    if tool.strict is not None:
        out["strict"] = tool.strict
    return out


def _message_items(m: ChatMessage, index: int) -> list[JSON]:
    """One chat message as Responses items; `index` keeps generated ids unique within the episode."""
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id or "", "output": m.text or ""}]
    if m.role != "assistant":
        return [{"type": "message", "role": m.role, "content": content_to_input(m.content)}]
    items: list[JSON] = []
    if m.reasoning_content:
        items.append({"type": "reasoning", "id": f"rs_{index}",
                      "summary": [{"type": "summary_text", "text": m.reasoning_content}]})
    if m.text or not m.tool_calls:  # an empty answer is still an answer (NeMo Gym keeps the message item)
        items.append({"type": "message", "id": f"msg_{index}", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": m.text or "", "annotations": []}]})
    for j, call in enumerate(m.tool_calls or ()):
        items.append({"type": "function_call", "id": f"fc_{index}_{j}", "call_id": call.id,
                      "name": call.function.name, "arguments": call.function.arguments, "status": "completed"})
    return items


def items(messages: Sequence[ChatMessage], start: int = 0) -> list[JSON]:
    return [item for i, m in enumerate(messages) for item in _message_items(m, start + i)]


def create_params(task: Task) -> JSON:
    """The row's `responses_create_params` as far as the task keeps it (roles developer->system, text parts joined
    unless the message holds an image, whose parts come back as the row had them)."""
    params: JSON = {"input": items(task.messages)}
    if task.tools:
        params["tools"] = [tool_json(t) for t in task.tools]
    s = task.sampling
    for key, value in (("temperature", s.temperature), ("top_p", s.top_p), ("max_output_tokens", s.max_tokens)):
        if value is not None:
            params[key] = value
    return params


def response(messages: Sequence[ChatMessage], prompt_len: int, params: JSON, model: str) -> JSON:
    """The episode after the prompt as a Responses API `response` object (the fields the type requires)."""
    return {
        "id": "resp_gymflow", "object": "response", "created_at": float(int(time.time())), "model": model or "policy",
        "status": "completed", "output": items(messages[prompt_len:], prompt_len),
        "tools": params.get("tools", []), "tool_choice": "auto", "parallel_tool_calls": True,
        "incomplete_details": None, "error": None, "metadata": {},
    }
