"""NeMo Gym rows speak the OpenAI Responses API; gymflow speaks Chat Completions. Convert at the edge."""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from gymflow.kernel.errors import TaskError
from gymflow.kernel.wire import (
    ChatMessage,
    Content,
    FunctionCall,
    ImagePart,
    ImageURL,
    SamplingParams,
    TextPart,
    ToolCall,
    ToolSpec,
    image_url_problem,
)

_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


def validation_message(err: ValidationError, where: str) -> str:
    """A pydantic error as `where.field: message`, naming the first problem only. Union branch tags ("plain string",
    "content parts": gymflow/kernel/wire.py) are no identifiers and are left out of the path."""
    first = err.errors()[0]
    loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"]
                  if isinstance(p, int) or p.isidentifier())
    return f"{where}{loc}: {first['msg']}"


def _optional_str(item: dict[str, Any], key: str, where: str) -> str | None:
    value = item.get(key)
    if value is not None and not isinstance(value, str):
        raise TaskError(f"{where}.{key}: expected a string")
    return value


_TEXT_PARTS = ("input_text", "output_text", "text")
_DETAILS = ("auto", "low", "high")


def _image_part(part: dict[str, Any], where: str) -> ImagePart:
    """A Responses `input_image` part -> a chat `image_url` part (inline data URLs only: nothing is fetched)."""
    if part.get("file_id") is not None:
        raise TaskError(f"{where}.file_id: uploaded files are not supported; give the image as a data: URL in "
                        "image_url")
    url = part.get("image_url")
    if url is None:
        raise TaskError(f"{where}.image_url: required (a data:image/...;base64, URL)")
    if problem := image_url_problem(url):
        raise TaskError(f"{where}.image_url: {problem}")
    detail = part.get("detail")
    if detail is not None and detail not in _DETAILS:
        raise TaskError(f"{where}.detail: expected one of {', '.join(_DETAILS)}, got {detail!r}")
    return ImagePart(image_url=ImageURL(url=url, detail=detail))


def _content(content: Any, where: str) -> Content:
    """Responses message content -> chat content: text parts joined into a string as before, unless the
    message holds an image, which keeps every part in order."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise TaskError(f"{where}.content: expected a string or a list of content parts")
    parts: list[TextPart | ImagePart] = []
    for i, part in enumerate(content):
        here = f"{where}.content[{i}]"
        if isinstance(part, str):
            parts.append(TextPart(text=part))
        elif not isinstance(part, dict):
            raise TaskError(f"{here}: expected a text or image part")
        elif part.get("type") == "input_image":
            parts.append(_image_part(part, here))
        elif isinstance(part.get("text"), str):  # any part with a text, whatever its type, as before images
            parts.append(TextPart(text=part["text"]))
        else:
            raise TaskError(f"{here}: expected a text part ({', '.join(_TEXT_PARTS)}) or an input_image part, got "
                            f"type {part.get('type')!r}")
    if not any(isinstance(p, ImagePart) for p in parts):
        return "".join(p.text for p in parts if isinstance(p, TextPart))
    return tuple(parts)


def content_to_input(content: Content) -> str | list[dict[str, Any]]:
    """The inverse of the message content conversion: a string as it is; parts as `input_text` and `input_image`
    parts, the image as a row has it (`image_url` a string, `detail` only when one was given)."""
    if content is None or isinstance(content, str):
        return content or ""
    out: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, ImagePart):
            image: dict[str, Any] = {"type": "input_image", "image_url": part.image_url.url}
            if part.image_url.detail is not None:
                image["detail"] = part.image_url.detail
            out.append(image)
        else:
            out.append({"type": "input_text", "text": part.text})
    return out


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
            content = _content(item.get("content"), here)
            if role != "user" and isinstance(content, tuple):
                raise TaskError(f"{here}.content: an image in a {raw_role} message; only user messages may hold "
                                "images")
            out.append(ChatMessage(role=role, content=content))
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
