"""Small builders shared by tests."""

from __future__ import annotations

from gymflow.kernel.datasets import load_jsonl
from gymflow.kernel.wire import ChatMessage, Task
from tests.conftest import SHARED

WEATHER_DATASET = SHARED / "example_single_tool_call" / "example.jsonl"


def weather_task(task_id: str = "w0") -> Task:
    tasks, errors = load_jsonl(WEATHER_DATASET, env="single_tool")
    assert not errors
    return tasks[0].model_copy(update={"id": task_id})


def user_task(text: str, task_id: str = "u0") -> Task:
    return Task(id=task_id, env="single_tool", messages=(ChatMessage(role="user", content=text),))
