"""Wire types: the frozen pydantic models that cross the Temporal boundary.

Everything here must stay small and serialisable; workflows import only this module.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from gymflow.kernel.limits import MAX_IMAGE_URL_CHARS

JSON = dict[str, Any]


class Wire(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FunctionCall(Wire):
    name: str
    arguments: str = Field(description="JSON-encoded arguments, exactly as the model produced them")


class ToolCall(Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


# Images come inline only: an http(s) URL would be fetched by whoever serves the model, at run time, from
# wherever the row points (and could change between samples). These are the types the OpenAI chat API and vLLM
# accept.
IMAGE_MEDIA_TYPES = ("png", "jpeg", "gif", "webp")
_DATA_URL = re.compile(r"data:image/([A-Za-z0-9.+-]+);base64,")
_BASE64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
_EXPECTED_URL = f"expected a data:image/<{'|'.join(IMAGE_MEDIA_TYPES)}>;base64,... URL"


def image_url_problem(url: Any) -> str | None:
    """Why `url` is not an image gymflow accepts (None: it is one). Shared by the wire type and the row loaders,
    which name the field."""
    if not isinstance(url, str):
        return f"{_EXPECTED_URL}, got {type(url).__name__}"
    if len(url) > MAX_IMAGE_URL_CHARS:
        return f"{len(url):,} characters; at most {MAX_IMAGE_URL_CHARS:,} (MAX_IMAGE_URL_CHARS)"
    found = _DATA_URL.match(url)
    if found is None:
        if url[:8].lower().startswith(("http://", "https://")):
            return f"{_EXPECTED_URL}: images are not downloaded at run time, embed the image instead"
        return _EXPECTED_URL
    if found.group(1) not in IMAGE_MEDIA_TYPES:
        return f"unsupported media type image/{found.group(1)}; {_EXPECTED_URL}"
    payload = url[found.end():]
    if not payload or not _BASE64.fullmatch(payload):
        return "the data URL's payload is not base64"
    return None


class ImageURL(Wire):
    url: str
    detail: Literal["auto", "low", "high"] | None = None

    @field_validator("url")
    @classmethod
    def _inline(cls, url: str) -> str:
        if problem := image_url_problem(url):
            raise ValueError(problem)
        return url


class TextPart(Wire):
    type: Literal["text"] = "text"
    text: str


class ImagePart(Wire):
    type: Literal["image_url"] = "image_url"
    image_url: ImageURL


def _part_kind(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return {"text": "text part", "image_url": "image part"}.get(kind) if isinstance(kind, str) else None


def _content_kind(value: Any) -> str | None:
    if isinstance(value, str):
        return "plain string"
    return "content parts" if isinstance(value, (list, tuple)) else None


# Tagged unions: only the matching branch is tried, so an error names that branch's problem alone. The tags are no
# identifiers, which is how validation_message (responses_format.py) leaves them out of the field path.
ContentPart = Annotated[
    Annotated[TextPart, Tag("text part")] | Annotated[ImagePart, Tag("image part")],
    Discriminator(_part_kind, custom_error_type="content_part",
                  custom_error_message="expected a part of type 'text' or 'image_url'"),
]
# A plain string (every text-only message, exactly as before parts existed) or Chat Completions content parts.
Content = Annotated[
    Annotated[str, Tag("plain string")] | Annotated[tuple[ContentPart, ...], Tag("content parts")],
    Discriminator(_content_kind, custom_error_type="content",
                  custom_error_message="expected a string or a list of content parts"),
] | None


def content_text(content: Content) -> str | None:
    """The text of a message's content: a string as it is, parts' text joined (images left out)."""
    if content is None or isinstance(content, str):
        return content
    return "".join(p.text for p in content if isinstance(p, TextPart))


def content_chars(content: Content) -> int:
    """The characters a message's content stores, image URLs included (for size limits)."""
    if content is None or isinstance(content, str):
        return len(content or "")
    return sum(len(p.text) if isinstance(p, TextPart) else len(p.image_url.url) for p in content)


def content_json(content: Content) -> str | list[JSON] | None:
    """Content as the chat API takes it: a string, or a list of parts (no null fields)."""
    if content is None or isinstance(content, str):
        return content
    return [p.model_dump(exclude_none=True) for p in content]


def shown_content(content: Any) -> str | None:
    """A stored message's content (its JSON, as the store and exports hold it) as text for people: a string as it
    is, parts as their text in order with `[image_url]` (the part's type) for each other part."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list | tuple):
        return "".join(str(p.get("text", "")) if isinstance(p, dict) and p.get("type") == "text"
                       else f"[{p.get('type', 'part') if isinstance(p, dict) else 'part'}]" for p in content)
    return str(content)


class ChatMessage(Wire):
    """One Chat Completions message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Content = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    @field_validator("content")
    @classmethod
    def _some_parts(cls, content: Content) -> Content:
        if isinstance(content, tuple) and not content:
            raise ValueError("expected a string or at least one content part")
        return content

    @model_validator(mode="after")
    def _images_from_users(self) -> ChatMessage:
        # The chat API takes image parts in user messages only; any other role's would be refused mid-run.
        if self.role != "user" and isinstance(self.content, tuple):
            for i, part in enumerate(self.content):
                if isinstance(part, ImagePart):
                    raise ValueError(f"content[{i}]: an image part in a {self.role} message; only user messages "
                                     "may hold images")
        return self

    @property
    def text(self) -> str | None:
        """The content's text (content_text): what token counts, renderers and verifiers read."""
        return content_text(self.content)

    def to_openai(self) -> JSON:
        out: JSON = {"role": self.role, "content": content_json(self.content)}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None and self.role == "tool":
            out["name"] = self.name
        return out


class ToolSpec(Wire):
    """A function tool in Chat Completions shape (`{"type": "function", "function": {...}}`)."""

    name: str
    description: str = ""
    parameters: JSON = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool | None = None

    def to_openai(self) -> JSON:
        fn: JSON = {"name": self.name, "description": self.description, "parameters": self.parameters}
        if self.strict is not None:
            fn["strict"] = self.strict
        return {"type": "function", "function": fn}


# Longer than any timeout anyone means: a bigger number is a unit slip (ms for s), and timedelta overflows.
MAX_DURATION_S = 365 * 24 * 3600.0


class SamplingParams(Wire):
    # The OpenAI ranges (the local model server's too); NaN and infinity are never a setting.
    model_config = ConfigDict(allow_inf_nan=False)

    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(1 << 63), le=(1 << 63) - 1)  # vLLM's: a 64-bit integer
    stop: tuple[str, ...] | None = None


class Task(Wire):
    """A dataset row, environment-agnostic: the prompt, its tools, and the verifier's fields."""

    id: str
    env: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    sampling: SamplingParams = SamplingParams()
    data: JSON = Field(default_factory=dict, description="Fields the environment's verifier reads")
    # strict: a JSON true or 1.5 is a bad row, not 1 turn (gymflow/data/datasets.py says which line)
    max_turns: int | None = Field(None, ge=1, strict=True,
                                  description="The row's own turn limit: a rollout runs min(run's, this) turns")


class ActivityLimits(Wire):
    """Timeouts and retry bounds for one kind of activity. Every field is finite on purpose: a zero or negative
    timeout made every rollout hang, and Temporal reads max_attempts 0 as "retry forever"."""

    model_config = ConfigDict(allow_inf_nan=False)

    start_to_close_s: float = Field(gt=0, le=MAX_DURATION_S)
    schedule_to_close_s: float = Field(gt=0, le=MAX_DURATION_S, description="All attempts together")
    heartbeat_s: float | None = Field(None, gt=0, le=MAX_DURATION_S, description="null: no heartbeat timeout")
    max_attempts: int = Field(5, ge=1)
    initial_backoff_s: float = Field(1.0, gt=0, le=MAX_DURATION_S)
    max_backoff_s: float = Field(60.0, gt=0, le=MAX_DURATION_S)

    @model_validator(mode="after")
    def _consistent(self) -> ActivityLimits:
        if self.schedule_to_close_s < self.start_to_close_s:
            raise ValueError(f"schedule_to_close_s ({self.schedule_to_close_s:g}) must be at least "
                             f"start_to_close_s ({self.start_to_close_s:g}): it bounds all attempts together")
        if self.heartbeat_s is not None and self.heartbeat_s > self.start_to_close_s:
            raise ValueError(f"heartbeat_s ({self.heartbeat_s:g}) must be at most start_to_close_s "
                             f"({self.start_to_close_s:g})")
        if self.max_backoff_s < self.initial_backoff_s:
            raise ValueError(f"max_backoff_s ({self.max_backoff_s:g}) must be at least initial_backoff_s "
                             f"({self.initial_backoff_s:g})")
        return self


class RolloutLimits(Wire):
    generate: ActivityLimits = ActivityLimits(
        start_to_close_s=600, schedule_to_close_s=3600, heartbeat_s=30, max_attempts=6
    )
    # Env activities heartbeat while environment code runs, so a killed env worker is noticed in 20 s
    # rather than at start-to-close.
    env: ActivityLimits = ActivityLimits(start_to_close_s=120, schedule_to_close_s=900, heartbeat_s=20, max_attempts=4)
    persist: ActivityLimits = ActivityLimits(start_to_close_s=30, schedule_to_close_s=900, max_attempts=20)
    # The by-reference workflow keeps the episode in Postgres, far from Temporal's limit; this bounds what one
    # episode may store: message contents and tool calls, environment states and token data (one number 8 bytes).
    max_episode_bytes: int = Field(64 << 20, ge=1)
    # What one model reply may bring: its characters (content, reasoning, tool call ids, names and arguments), and
    # as many token ids or logprobs per list; and the tool calls of it that are run. Over either, the turn fails
    # typed (reply_too_large, too_many_tool_calls).
    max_reply_chars: int = Field(1_000_000, ge=1, description="The most characters of one model reply (content, "
                                                              "reasoning, tool calls) stored")
    max_tool_calls_per_turn: int = Field(64, ge=1, description="Tool calls of one reply that are run")


class Usage(Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
        )


class RolloutInput(Wire):
    run_id: str
    task: Task
    sample_index: int
    model: str = Field(description="Model name from config; the worker resolves endpoint and key")
    sampling: SamplingParams = SamplingParams()
    max_turns: int = 8
    limits: RolloutLimits = RolloutLimits()
    turns_per_run: int | None = Field(
        None, description="Continue as new after this many turns; also whenever Temporal suggests it")

    @property
    def rollout_id(self) -> str:
        return rollout_id(self.run_id, self.task.id, self.sample_index)


def rollout_id(run_id: str, task_id: str, sample_index: int) -> str:
    """Deterministic workflow id `<run>/<task>/<sample>`: the key that makes collections resumable."""
    return f"{run_id}/{task_id}/{sample_index}"


def sample_index_of(rollout_id: str) -> int:
    """The sample index a `rollout_id` ends with (task ids hold no '/', so the last part is the index)."""
    return int(rollout_id.rsplit("/", 1)[1])


class Score(Wire):
    reward: float | None = Field(description="None only when masked: an unscorable episode is not a 0")
    details: JSON = Field(default_factory=dict)
    masked: bool = Field(False, description="Exclude from training and metrics (e.g. the judge failed)")
    failure_type: str | None = None


RolloutStatus = Literal["running", "completed", "failed"]


class RolloutSummary(Wire):
    """What a rollout workflow returns: small, no transcript."""

    rollout_id: str
    run_id: str
    task_id: str
    sample_index: int
    status: RolloutStatus
    reward: float | None = None
    masked: bool = False
    failure_type: str | None = None
    failure_message: str | None = None
    turns: int = 0
    tool_calls: int = 0
    usage: Usage = Usage()
    attempts: int = 0
    latency_s: float = 0.0


# ---- activity payloads -------------------------------------------------------------------------


class GenerateRequest(Wire):
    rollout_id: str
    task_id: str = ""
    turn: int
    model: str
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolSpec, ...] = ()
    sampling: SamplingParams = SamplingParams()


class ToolResult(Wire):
    message: ChatMessage
    state: JSON
    is_error: bool = False
    done: bool = Field(False, description="The environment ended the episode with this call: verify next")


def not_run_message(call: ToolCall, ended_by: str) -> ChatMessage:
    """The answer to a call the model made in the same turn after the one that ended the episode: not run
    (nothing may change the state after the end), but answered, so every call in the transcript has its tool
    message as Chat Completions requires (exports, training)."""
    return ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name,
                       content=f"Not run: the episode ended with the call to {ended_by!r}.")


class RolloutRecord(Wire):
    """Everything persisted about one finished (or failed) rollout."""

    summary: RolloutSummary
    env: str
    model: str
    # The last message of the accepted chain: the transcript and per-turn generations are read from the chain
    # (migration 0008). None when no message was stored (a rollout that failed before it began).
    head_id: int | None = None
    score_details: JSON = Field(default_factory=dict)
    # The workflow execution that writes it (the fence, gymflow/kernel/store/fence.py): its run id and start time
    # on Temporal's clock. None only for a rollout no execution ran (a start Temporal refused).
    execution_id: str | None = None
    execution_started_at: datetime | None = None
