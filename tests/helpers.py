"""Small builders shared by tests."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.wire import ChatMessage, Task
from tests.conftest import SHARED

WEATHER_DATASET = SHARED / "example_single_tool_call" / "example.jsonl"


def weather_task(task_id: str = "w0") -> Task:
    tasks, errors = load_jsonl(WEATHER_DATASET, env="single_tool")
    assert not errors
    return tasks[0].model_copy(update={"id": task_id})


def user_task(text: str, task_id: str = "u0") -> Task:
    return Task(id=task_id, env="single_tool", messages=(ChatMessage(role="user", content=text),))


def readable_history(history_json: str) -> str:
    """A history as JSON plus every payload's data decoded: `to_json()` holds payloads base64-encoded, so a
    plain substring search of it would find nothing that travelled in a payload."""
    parts = [history_json]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if "metadata" in node and isinstance(node.get("data"), str):
                parts.append(base64.b64decode(node["data"]).decode("utf-8", "replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(history_json))
    return "\n".join(parts)


class FakeJudge:
    """A `ctx.chat` that answers from a script; an Exception in the script is raised instead."""

    def __init__(self, *replies: str | Exception) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[str, list[ChatMessage]]] = []

    async def __call__(self, model: str, messages: Sequence[ChatMessage]) -> str:
        self.calls.append((model, list(messages)))
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply


async def record_episode_histories(client: GymflowClient, run_id: str, cases: dict[str, dict[str, Any]],
                                   model: str = "policy") -> None:
    """Run one single-tool episode per case (task id = case name, `update` applied to its input), each of which
    must replay through the SDK's strict sandbox (the workflow is deterministic)."""
    from gymflow.workflows.episode import EpisodeWorkflow

    replayer = Replayer(workflows=[EpisodeWorkflow], data_converter=pydantic_data_converter)
    for name, update in cases.items():
        inp = client.make_input(run_id, weather_task(name), 0, model).model_copy(update=update)
        await client.run_rollout(inp)
        history = await client.temporal.get_workflow_handle(inp.rollout_id).fetch_history()
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert result.replay_failure is None, (name, result.replay_failure)


async def insert_generation(session: Any, **values: Any) -> None:
    """A `generations` row as the episode's finish writes it, for tests that build runs by hand."""
    from sqlalchemy.dialects.postgresql import insert

    from gymflow.kernel.store.models import Generation

    await session.execute(insert(Generation).values(**values).on_conflict_do_nothing())
