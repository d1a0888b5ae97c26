"""The environment plug-in contract.

An environment turns a wire `Task` into its own frozen task type, sets up serialisable episode
state, exposes tool schemas, runs tool calls on that state, and scores a transcript.

The episode ends when the model answers without tool calls, at the turn limit (the run's, or the row's
`max_turns` when lower), or when the environment ends it: a successful call to one of `terminal_tools`, or
a `ToolOutput` with `done=True` (the environment's own stop rule). Calls the model made after the ending
one in the same turn are not run; each gets a "Not run" tool message. Then `verify` scores the episode.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from gymflow.kernel.errors import TaskError, ToolError
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

JSON = dict[str, Any]


class TaskData(BaseModel):
    """Base for environment task types: frozen, unknown fields kept (NeMo Gym rows carry extras)."""

    model_config = ConfigDict(frozen=True, extra="allow")


T = TypeVar("T", bound=TaskData)

# (model name, messages) -> assistant text. Given to verifiers that need a judge model.
ChatFn = Callable[[str, Sequence[ChatMessage]], Awaitable[str]]


@dataclass
class ToolOutput:
    content: str
    state: JSON = field(default_factory=dict)
    done: bool = False  # end the episode after this call's tool message (a stop rule of the environment's own)


@dataclass
class VerifyContext:
    """What a verifier may use beyond the transcript. `chat` is None when no judge is available."""

    policy_model: str
    chat: ChatFn | None = None
    options: JSON = field(default_factory=dict)


Placement = Literal["local", "pool"]


class Environment(ABC, Generic[T]):
    name: ClassVar[str]
    task_type: ClassVar[type[TaskData]]
    # Where setup, tool calls and verify run (docs/architecture.md): "local" as local activities inside the
    # workflow pool (cheap, in-process, no sandbox: fewer Temporal transitions per rollout), "pool" on the env
    # pool (sandboxed, judged or heavy). Overridden per run by `environments.<name>.placement` in the config.
    placement: ClassVar[Placement] = "pool"
    # True for an adapter whose rows may carry any other environment's fields (nemo_gym): routing then never
    # tells such a row it fits another environment better.
    accepts_any_row: ClassVar[bool] = False

    @classmethod
    def placement_for(cls, options: JSON) -> Placement:
        """The placement for a run with these environment options (the config's `environments.<name>`)."""
        return cls.placement
    # Row fields beyond `task_type`'s own that this environment's rows carry (NeMo Gym rows bring extras such as
    # `uuid`). Routing (gymflow/kernel/routing.py) compares the fields each environment knows to catch a row sent
    # to the wrong one, so list the fields that tell your rows apart.
    row_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def known_fields(cls) -> frozenset[str]:
        """The verifier fields this environment reads or expects in a row."""
        return frozenset(cls.task_type.model_fields) | frozenset(cls.row_fields)

    def parse_task(self, task: Task) -> T:
        """Validate the task's verifier fields; errors name the field."""
        try:
            return self.task_type.model_validate(task.data)  # type: ignore[return-value]
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "<row>"
            raise TaskError(f"{where}: {first['msg']} (environment {self.name})") from None

    def setup(self, task: Task, data: T) -> JSON:
        """Initial episode state. Must be JSON-serialisable and small (it travels in workflow history)."""
        return {}

    def initial_messages(self, task: Task, data: T) -> Sequence[ChatMessage]:
        return task.messages

    def tools(self, task: Task, data: T) -> Sequence[ToolSpec]:
        return task.tools

    async def call_tool(self, data: T, state: JSON, name: str, args: JSON) -> ToolOutput:
        """Run one tool call. Raise `ToolError` for anything the model should see and fix."""
        raise ToolError(f"unknown tool {name!r}")

    def terminal_tools(self, task: Task, data: T) -> Collection[str]:
        """Tools whose successful call ends the episode (e.g. `mark_task_complete`, `submit`); `call_tool` still
        runs them. A call that raised `ToolError` does not end it: the model sees the error and may fix it."""
        return ()

    @abstractmethod
    async def verify(self, data: T, messages: Sequence[ChatMessage], state: JSON, ctx: VerifyContext) -> Score:
        """Score the finished episode. Raise `VerifierError` when it cannot: the rollout is masked."""

    async def validate(self, task: Task) -> Score | None:
        """Score the task's gold answer (should be 1.0); None when the environment has no gold answer."""
        return None

    def gold_turns(self, task: Task, data: T) -> Sequence[ChatMessage] | None:
        """The gold answer as the assistant messages of a winning episode, one per turn (tool calls allowed);
        None when there is none. `gymflow env check` plays them through the real tool and verify paths."""
        return None


def final_assistant_text(messages: Sequence[ChatMessage]) -> str | None:
    """The content of the last assistant message, or None when the model never answered in text."""
    for m in reversed(messages):
        if m.role == "assistant":
            return m.content
    return None


def episode_assistant_texts(messages: Sequence[ChatMessage]) -> list[str]:
    """The text of every assistant message after the prompt (the last user or system message), in order: the
    model's own output over the episode, as NeMo Gym's verifiers read `response.output`."""
    start = max((i + 1 for i, m in enumerate(messages) if m.role in ("user", "system")), default=0)
    return [m.content for m in messages[start:] if m.role == "assistant" and m.content]


def called_tools(messages: Sequence[ChatMessage]) -> list[str]:
    return [c.function.name for m in messages if m.role == "assistant" for c in (m.tool_calls or ())]
