"""Function calling (NeMo Gym 0.7.0's `xlam_fc`, Salesforce xlam-function-calling-60k): the model's calls vs
`expected_answers`.

The row's tools are offered but never run: the episode ends after the model's first turn with tool calls, and
verify matches every call the model made against the expected ones as NeMo Gym does: same name, and each
expected argument present with an equal value (extra predicted arguments are ignored); each expected call
takes the first unmatched predicted call that fits, and the reward is 1 only when every expected call is
matched and the model made no other call. An empty `expected_answers` means the right answer is no call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gymflow.kernel.errors import TaskError
from gymflow.kernel.wire import ChatMessage, FunctionCall, Score, Task, ToolCall

# What the model would see if the episode went on (it does not: this output ends it).
NOT_EXECUTED = "Not executed: this environment scores the function calls without running them."
MAX_DETAIL_CALLS = 20  # calls named in Score.details; the transcript keeps them all


class ExpectedCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)

    @field_validator("arguments", mode="before")
    @classmethod
    def _json_string(cls, v: Any) -> Any:
        if isinstance(v, str):  # NeMo Gym also takes the arguments JSON-encoded
            try:
                v = json.loads(v)
            except ValueError as e:
                raise ValueError(f"not a JSON object: {e}") from None
        return v


class XlamFcTask(TaskData):
    expected_answers: list[ExpectedCall]


def call_arguments(raw: str) -> dict[str, Any]:
    """A model's arguments string as a dict; anything else (bad or deep JSON, a list, a number) is {}."""
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def predicted_calls(messages: Sequence[ChatMessage]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.function.name, call_arguments(c.function.arguments))
            for m in messages if m.role == "assistant" for c in (m.tool_calls or ())]


def _fits(predicted: tuple[str, dict[str, Any]], expected: ExpectedCall) -> bool:
    name, args = predicted
    return name == expected.name and all(k in args and args[k] == v for k, v in expected.arguments.items())


def count_matched(predicted: Sequence[tuple[str, dict[str, Any]]], expected: Sequence[ExpectedCall]) -> int:
    """Greedy, in order (NeMo Gym's rule, kept for equal rewards): each expected call takes the first unused
    predicted call that fits it."""
    used: set[int] = set()
    for exp in expected:
        hit = next((i for i, p in enumerate(predicted) if i not in used and _fits(p, exp)), None)
        if hit is not None:
            used.add(hit)
    return len(used)


class XlamFcEnvironment(Environment[XlamFcTask]):
    name = "xlam_fc"
    task_type = XlamFcTask
    row_fields = ("predicted_calls", "num_correct", "num_expected", "num_predicted")  # NeMo Gym rollout rows

    def parse_task(self, task: Task) -> XlamFcTask:
        data = super().parse_task(task)
        offered = {t.name for t in task.tools}
        for i, call in enumerate(data.expected_answers):
            if call.name not in offered:
                raise TaskError(f"expected_answers.{i}.name: {call.name[:100]!r} is not one of the row's tools "
                                f"({', '.join(sorted(offered)) or 'none offered'}) (environment {self.name})")
        return data

    async def call_tool(self, data: XlamFcTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        # The first valid call of a turn ends the episode; the turn's later calls are recorded, not run.
        return ToolOutput(content=NOT_EXECUTED, state=state, done=True)

    async def verify(self, data: XlamFcTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        predicted = predicted_calls(messages)
        expected = data.expected_answers
        correct = count_matched(predicted, expected)
        ok = correct == len(expected) == len(predicted)
        return Score(reward=1.0 if ok else 0.0, details={
            "num_expected": len(expected), "num_predicted": len(predicted), "num_correct": correct,
            "predicted_names": [name[:100] for name, _ in predicted[:MAX_DETAIL_CALLS]]})

    async def validate(self, task: Task) -> Score:
        data = self.parse_task(task)
        return await self.verify(data, (*task.messages, *self.gold_turns(task, data)), {}, VerifyContext(""))

    def gold_turns(self, task: Task, data: XlamFcTask) -> Sequence[ChatMessage]:
        """One turn: every expected call (no call and a short text when none is expected)."""
        calls = tuple(ToolCall(id=f"gold{i}", function=FunctionCall(name=c.name, arguments=json.dumps(c.arguments)))
                      for i, c in enumerate(data.expected_answers))
        if not calls:
            return (ChatMessage(role="assistant", content="No function call is needed."),)
        return (ChatMessage(role="assistant", tool_calls=calls),)
