"""Wire types: the frozen pydantic models that cross the Temporal boundary.

Everything here must stay small and serialisable; workflows import only this module.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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


class ChatMessage(Wire):
    """One Chat Completions message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: tuple[ToolCall, ...] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None

    def to_openai(self) -> JSON:
        out: JSON = {"role": self.role, "content": self.content}
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
