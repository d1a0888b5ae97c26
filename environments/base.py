"""The environment plug-in contract.

An environment turns a wire `Task` into its own frozen task type, sets up serialisable episode
state, exposes tool schemas, runs tool calls on that state, and scores a transcript.

The episode ends when the model answers without tool calls, at the turn limit (the run's, or the row's
`max_turns` when lower), or when the environment ends it: a successful call to one of `terminal_tools`, or
a `ToolOutput` with `done=True` (the environment's own stop rule). Calls the model made after the ending
one in the same turn are not run; each gets a "Not run" tool message. Then `verify` scores the episode.

An environment that converses (NeMo Gym's gymnasium servers: a scripted user, a game) also answers a turn without
tool calls: `responds` says it does for a task, `respond` gives the next user message (or ends the episode), and
`open_episode` may add the environment's first observation to the prompt. Both are async I/O and run in the worker's
event loop: only for environments with an `in_loop_reason`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


# (module-level function, *args) -> its result, run in a supervised process under the platform's limits.
IsolatedFn = Callable[..., Awaitable[Any]]

# Exceptions that are never the answer's fault: the machine or the process failed (I/O, a missing module, the
# interpreter). A scorer that raises one masks the rollout (VerifierError); any other exception a scorer raises
# over the model's answer scores it 0, as NeMo Gym does. MemoryError is left to propagate: the supervised process
# that ran out of its memory cap reports it (`verifier_crashed`) and is replaced.
PLATFORM_ERRORS: tuple[type[BaseException], ...] = (OSError, ImportError, SystemError)


@dataclass
class VerifyContext:
    """What a verifier may use beyond the transcript. `chat` is None when no judge is available.
    `run_isolated` is set for a verifier that runs in the worker's event loop (`in_loop_reason`): it runs CPU-bound
    work in a supervised process; see `run_isolated`."""

    policy_model: str
    chat: ChatFn | None = None
    options: JSON = field(default_factory=dict)
    run_isolated: IsolatedFn | None = None


async def run_isolated(ctx: VerifyContext, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` (a module-level function: it travels by name) in a supervised process when the verifier runs in
    the worker's loop; called directly when verify already runs in one (or in a test). A call past its limit or whose
    process dies raises `VerifierError` (masked, typed); what `fn` raises is raised here."""
    if ctx.run_isolated is not None:
        return await ctx.run_isolated(fn, *args)
    return fn(*args)


Placement = Literal["local", "pool"]
Step = Literal["setup", "tool", "verify"]

# Bounds of the per-call limits (activities/env_processes.py `Limits`). Below 0.1 s a call cannot even reach its
# supervised process; above them a stuck call holds a process for hours. Verify may wait on a judge: up to a day.
MIN_CALL_S = 0.1
MAX_CALL_S = 3600.0
MAX_VERIFY_S = 86_400.0
MIN_MEMORY_MB, MAX_MEMORY_MB = 64, 1_048_576  # below 64 MB a call's interpreter cannot start; above, 1 TiB


class EnvironmentOptions(BaseModel):
    """The options every environment takes (`environments.<name>.*` in the config); an environment with its own
    subclasses this as its `Options`. Checked when settings load and when a collect starts
    (`registry.check_options`); unset (None): the platform's default. Lax on purpose: `${VAR}` in the config gives
    strings, so "10" is 10; but NaN, a fraction where an integer goes, an unknown name fail at load."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    placement: Placement | None = Field(None, description="Where setup, tools and verify run (see `placement`)")
    tool_timeout_s: float | None = Field(None, ge=MIN_CALL_S, le=MAX_CALL_S, description="One tool call")
    setup_timeout_s: float | None = Field(None, ge=MIN_CALL_S, le=MAX_CALL_S, description="Setup")
    verify_timeout_s: float | None = Field(None, ge=MIN_CALL_S, le=MAX_VERIFY_S, description="Verify")
    memory_mb: int | None = Field(None, ge=MIN_MEMORY_MB, le=MAX_MEMORY_MB,
                                  description="A call's address space (RLIMIT_AS)")
    max_state_bytes: int | None = Field(None, ge=1024, le=1 << 30, description="The episode state's JSON size")


class Environment(ABC, Generic[T]):
    name: ClassVar[str]
    task_type: ClassVar[type[TaskData]]
    # Where setup, tool calls and verify run (docs/architecture.md): "local" as local activities inside the
    # workflow pool (cheap, in-process, no sandbox: fewer Temporal transitions per rollout), "pool" on the env
    # pool (sandboxed, judged or heavy). Overridden per run by `environments.<name>.placement` in the config.
    placement: ClassVar[Placement] = "pool"
    # The options this environment reads from `environments.<name>` (types, bounds; unknown names refused).
    Options: ClassVar[type[EnvironmentOptions]] = EnvironmentOptions
    # True for an adapter whose rows may carry any other environment's fields (nemo_gym): routing then never
    # tells such a row it fits another environment better.
    accepts_any_row: ClassVar[bool] = False
    # What a run needs beyond gymflow itself (a binary, a judge model, data, a server), one short phrase each:
    # `gymflow env list` shows them, so a newcomer knows before a rollout fails.
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def placement_for(cls, options: JSON) -> Placement:
        """The placement for a run with these environment options (the config's `environments.<name>`)."""
        return cls.placement

    # Isolation (docs/environments.md): by default setup, tool calls and verify run in supervised worker processes
    # (activities/env_processes.py), each call under a wall-clock and a memory limit, so nothing an environment does
    # with a model's input can stall a worker's event loop. An adapter whose own work is async I/O to something that
    # isolates it already (a sandbox, an HTTP server, a judge model) may run in the loop: it sets the one-line reason.
    in_loop_reason: ClassVar[str | None] = None

    def runs_in_loop(self, task: Task, options: JSON, step: Step) -> bool:
        """Whether `step` of `task` runs in the worker's event loop (see `in_loop_reason`) for a run with these
        options; False: in a supervised process. Decided in the worker: keep it cheap."""
        return self.in_loop_reason is not None

    def warm_up(self) -> None:
        """Import or build what calls will need, once per supervised process, before any call's clock starts."""
    # Row fields beyond `task_type`'s own that this environment's rows carry (NeMo Gym rows bring extras such as
    # `uuid`). Routing (gymflow/data/routing.py) compares the fields each environment knows to catch a row sent
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

    def responds(self, task: Task, data: T) -> bool:
        """Whether a turn without tool calls goes to `respond` instead of ending the episode. Decided when the
        reply is stored: keep it cheap (no I/O)."""
        return False

    async def respond(self, data: T, state: JSON, messages: Sequence[ChatMessage]) -> ToolOutput:
        """The environment's answer to a turn without tool calls (`messages` ends with it): `content` becomes the
        next user message, `state` the episode's; `done` ends the episode (the message then carries the final state,
        its content the last observation, often empty). Raise `GymflowError` for the platform's failures."""
        raise NotImplementedError(f"{self.name} does not respond to turns without tool calls")

    async def discover_tools(self, data: T, state: JSON) -> tuple[list[ToolSpec], JSON]:
        """(tools, state) for an environment that learns some of its tools only from a running service (a NeMo Gym
        server that lists them over MCP): offered with `tools()` for this episode (a `tools()` tool of the same
        name wins) and accepted by the tool-call check. Called once at setup, only for an environment that runs in
        the loop (its I/O is there); default: none."""
        return [], state

    async def open_episode(self, data: T, state: JSON) -> tuple[list[ChatMessage], JSON]:
        """(user messages appended to the prompt, state) before the first turn, for an environment whose episode
        starts with its own observation; default: none. Only for environments that respond (`responds`)."""
        return [], state

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
            return m.text
    return None


def episode_assistant_texts(messages: Sequence[ChatMessage]) -> list[str]:
    """The text of every assistant message after the prompt (the last user or system message), in order: the
    model's own output over the episode, as NeMo Gym's verifiers read `response.output`."""
    start = max((i + 1 for i, m in enumerate(messages) if m.role in ("user", "system")), default=0)
    return [m.text for m in messages[start:] if m.role == "assistant" and m.text]


def called_tools(messages: Sequence[ChatMessage]) -> list[str]:
    return [c.function.name for m in messages if m.role == "assistant" for c in (m.tool_calls or ())]
