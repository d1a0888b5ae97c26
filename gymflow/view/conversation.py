"""A rollout's messages shaped for reading: role, text cut to a bound (with the full length, for a link to the
rest), reasoning, tool calls with their arguments, and a generated turn's token metadata. Escaping is the
template's job (autoescape); nothing here produces markup."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from gymflow.view.queries import CUT, Row

PAGE_MESSAGES = 50  # messages per page of a long episode


@dataclass
class ToolCall:
    name: str
    call_id: str
    arguments: str
    arguments_len: int


@dataclass
class Shown:
    index: int  # place in the chain (0 = first message): the key of its full-text and token links
    role: str
    content: str | None
    content_len: int
    reasoning: str | None = None
    reasoning_len: int = 0
    tool_calls: list[ToolCall] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)  # name, tool_call_id, anything else in the body
    turn: int | None = None  # generated turns, numbered from 0 like `generations.turn`
    meta: dict[str, Any] = field(default_factory=dict)
    prompt_ids_n: int | None = None
    generation_ids_n: int | None = None
    logprobs_n: int | None = None

    @property
    def content_cut(self) -> bool:
        return self.content is not None and self.content_len > len(self.content)

    @property
    def reasoning_cut(self) -> bool:
        return self.reasoning is not None and self.reasoning_len > len(self.reasoning)

    @property
    def usage(self) -> dict[str, Any]:
        usage = self.meta.get("usage")
        return usage if isinstance(usage, dict) else {}


def as_text(value: Any) -> str:
    """A field as text; a list of content parts as its text, an image as a one-line placeholder."""
    if isinstance(value, list):
        return "\n".join(_part_text(p) for p in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return part["text"]
    if isinstance(part, dict) and part.get("type") == "image_url":
        url = (part.get("image_url") or {}).get("url") if isinstance(part.get("image_url"), dict) else None
        url = url if isinstance(url, str) else ""
        kind = re.match(r"data:([a-z/+.-]{1,40});", url)
        return f"[image: {kind.group(1) if kind else 'not a data URL'}, {len(url)} characters]"
    return json.dumps(part, ensure_ascii=False)


def _tool_calls(raw: Any, cut: int) -> list[ToolCall]:
    if not isinstance(raw, list):
        return []
    out = []
    for call in raw:
        fn = call.get("function") if isinstance(call, dict) else None
        fn = fn if isinstance(fn, dict) else {}
        args = as_text(fn.get("arguments", ""))
        call_id = call.get("id", "") if isinstance(call, dict) else ""
        out.append(ToolCall(name=as_text(fn.get("name", "?")), call_id=as_text(call_id), arguments=args[:cut],
                            arguments_len=len(args)))
    return out


def from_rows(rows: list[Row], first_index: int, turns: dict[int, int], cut: int = CUT) -> list[Shown]:
    """Messages read by `queries.messages` (in chain order, starting at chain index `first_index`); `turns` maps
    a chain index to its turn number."""
    out = []
    for i, r in enumerate(rows, start=first_index):
        rest = dict(r["rest"] or {})
        calls = rest.pop("tool_calls", None)
        rest.pop("role", None)
        out.append(Shown(index=i, role=r["role"], content=r["content"], content_len=r["content_len"] or 0,
                         reasoning=r["reasoning"], reasoning_len=r["reasoning_len"] or 0,
                         tool_calls=_tool_calls(calls, cut), extra=rest, turn=turns.get(i), meta=r["meta"] or {},
                         prompt_ids_n=r["prompt_ids_n"], generation_ids_n=r["generation_ids_n"],
                         logprobs_n=r["logprobs_n"]))
    return out


def from_transcript(transcript: list[Any], first_index: int, turns: dict[int, int], cut: int = CUT) -> list[Shown]:
    """The same for a transcript stored whole (rows written before migration 0008)."""
    out = []
    for i, m in enumerate(transcript, start=first_index):
        m = dict(m) if isinstance(m, dict) else {"role": "?", "content": m}
        content = m.pop("content", None)
        text = None if content is None else as_text(content)
        reasoning = m.pop("reasoning_content", None)
        reasoning = None if reasoning is None else as_text(reasoning)
        calls = m.pop("tool_calls", None)
        role = as_text(m.pop("role", "?"))
        out.append(Shown(index=i, role=role, content=None if text is None else text[:cut],
                         content_len=len(text or ""), reasoning=None if reasoning is None else reasoning[:cut],
                         reasoning_len=len(reasoning or ""), tool_calls=_tool_calls(calls, cut), extra=m,
                         turn=turns.get(i)))
    return out


def turn_numbers(generated: list[bool]) -> dict[int, int]:
    """Chain index -> turn number of each generated (assistant, with token data) message."""
    out: dict[int, int] = {}
    for i, g in enumerate(generated):
        if g:
            out[i] = len(out)
    return out


def page_bounds(total: int, page: int, size: int = PAGE_MESSAGES) -> tuple[int, int, int]:
    """(first index, end index, pages) of a page of `total` messages; a page past the end shows the last."""
    pages = max(1, -(-total // size))
    page = min(max(page, 1), pages)
    return (page - 1) * size, min(page * size, total), pages
