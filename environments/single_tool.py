"""The single-tool environment (NeMo Gym's `example_single_tool_call`): one `get_weather` tool.

Reward 1.0 when the model called `get_weather`, as NeMo Gym scores it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, called_tools

from gymflow.kernel.errors import ToolError
from gymflow.kernel.wire import ChatMessage, FunctionCall, Score, Task, ToolCall, ToolSpec

GET_WEATHER = ToolSpec(
    name="get_weather",
    description="",
    parameters={"type": "object", "properties": {"city": {"type": "string", "description": ""}},
                "required": ["city"], "additionalProperties": False},
    strict=True,
)


class SingleToolTask(TaskData):
    """No verifier fields: the reward depends only on whether the tool was called."""


class SingleToolEnvironment(Environment[SingleToolTask]):
    name = "single_tool"
    task_type = SingleToolTask
    placement = "local"  # in-process and cheap: runs inside the workflow pool

    def tools(self, task: Task, data: SingleToolTask) -> Sequence[ToolSpec]:
        return task.tools or (GET_WEATHER,)

    async def call_tool(self, data: SingleToolTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        if name != "get_weather":
            raise ToolError(f"unknown tool {name!r}; available: get_weather")
        city = args.get("city")
        if not isinstance(city, str) or not city.strip():
            raise ToolError("get_weather: argument 'city' (a non-empty string) is required")
        calls = int(state.get("weather_calls", 0)) + 1
        payload = {"city": city, "weather_description": f"The weather in {city} is cold."}
        return ToolOutput(content=json.dumps(payload), state={**state, "weather_calls": calls})

    async def verify(self, data: SingleToolTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        called = "get_weather" in called_tools(messages)
        return Score(reward=1.0 if called else 0.0, details={"called_get_weather": called})

    async def validate(self, task: Task) -> Score:
        gold = ChatMessage(role="assistant", tool_calls=(
            ToolCall(id="gold", function=FunctionCall(name="get_weather", arguments='{"city": "SF"}')),))
        return await self.verify(self.parse_task(task), (*task.messages, gold), {}, VerifyContext(""))
