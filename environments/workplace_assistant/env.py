"""The workplace assistant environment (NeMo Gym's `workplace_assistant`, a port of WorkBench).

27 tools over email, calendar, analytics, project management, CRM and a company directory.
Episode state is only the list of mutating calls applied so far: the world is rebuilt by replaying
them onto the pristine tables, so state stays small enough for workflow history.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext
from gymflow.environments.workplace_assistant.dispatch import Call, clean_args, parse_arguments, replay, run, spec
from gymflow.environments.workplace_assistant.verify import mismatched_tables
from gymflow.environments.workplace_assistant.world import data_dir
from pydantic import BaseModel, ConfigDict

from gymflow.kernel.errors import ConfigError, ToolError, VerifierError
from gymflow.kernel.responses_format import tool_to_spec
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

# The order NeMo Gym lists the tools in.
_SCHEMA_FILES = ("company_directory", "email", "calendar", "analytics", "project_management",
                 "customer_relationship_manager")


class GroundTruthCall(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    name: str
    arguments: str | dict[str, Any]  # NeMo Gym rows carry a JSON string


class WorkplaceTask(TaskData):
    ground_truth: tuple[GroundTruthCall, ...]


def default_tools() -> tuple[ToolSpec, ...]:
    """The 27 schemas from `<data>/tool_schemas`, for rows that do not carry their own."""
    return _tools_at(str(data_dir()))


@cache
def _tools_at(root: str) -> tuple[ToolSpec, ...]:
    specs = []
    for stem in _SCHEMA_FILES:
        path = Path(root) / "tool_schemas" / f"{stem}.json"
        try:
            tools = json.loads(path.read_text())["tools"]
        except (OSError, ValueError, KeyError) as e:
            raise ConfigError(f"workplace_assistant tool schemas unreadable at {path}: {e}") from None
        specs += [tool_to_spec(t, f"{path}:tools[{i}]") for i, t in enumerate(tools)]
    return tuple(specs)


def render(result: Any) -> str:
    """NeMo Gym's response body, byte for byte: `{"output": ...}`, compact, non-ASCII kept."""
    return json.dumps({"output": result}, ensure_ascii=False, separators=(",", ":"))


def applied_calls(state: JSON) -> list[Call]:
    calls = state.get("calls", [])
    if not isinstance(calls, list) or not all(
            isinstance(c, list) and len(c) == 2 and isinstance(c[0], str) and isinstance(c[1], dict)
            for c in calls):
        raise VerifierError("workplace_assistant state.calls must be a list of [tool name, arguments]")
    return calls


def gold_calls(data: WorkplaceTask) -> list[Call]:
    out: list[Call] = []
    for call in data.ground_truth:
        try:
            out.append([call.name, parse_arguments(call.arguments)])
        except ValueError:
            continue  # NeMo Gym cannot run unparsable gold arguments either: that call changes nothing
    return out


class WorkplaceAssistantEnvironment(Environment[WorkplaceTask]):
    name = "workplace_assistant"
    task_type = WorkplaceTask
    row_fields = ("category", "environment_name")  # NeMo Gym's rows carry them (routing, environments/base.py)
    needs = ("NeMo Gym's workplace_assistant data ($GYMFLOW_WORKPLACE_DATA)",)
    placement = "local"  # in-process and cheap: runs inside the workflow pool

    def setup(self, task: Task, data: WorkplaceTask) -> JSON:
        return {"calls": []}

    def tools(self, task: Task, data: WorkplaceTask) -> Sequence[ToolSpec]:
        return task.tools or default_tools()

    async def call_tool(self, data: WorkplaceTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        tool = spec(name)
        calls = applied_calls(state) if "calls" in state else []
        world = replay(calls)
        result = run(world, name, args)
        if tool.mutating:
            # Only successful changes are kept: a failed call raised above and left state as it was.
            state = {**state, "calls": [*calls, [name, clean_args(tool, args)]]}
        return ToolOutput(content=render(result), state=state)

    async def verify(self, data: WorkplaceTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        # NeMo Gym replays every call in the transcript; replaying the applied ones from state is the
        # same thing, since a failed call changes nothing and a replay is deterministic.
        calls = applied_calls(state)
        bad = mismatched_tables(calls, gold_calls(data))
        return Score(reward=0.0 if bad else 1.0, details={"applied_calls": len(calls), "mismatched_tables": bad})

    async def validate(self, task: Task) -> Score:
        """Run the ground truth through `call_tool`, as a perfect model would, and verify it."""
        data = self.parse_task(task)
        state = self.setup(task, data)
        errors = []
        for name, args in gold_calls(data):
            try:
                state = (await self.call_tool(data, state, name, args)).state
            except ToolError as e:
                errors.append(f"{name}: {e}")
        score = await self.verify(data, task.messages, state, VerifyContext(policy_model=""))
        return score.model_copy(update={"details": {**score.details, "gold_call_errors": errors}})
