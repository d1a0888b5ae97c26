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


async def store_chain(session: Any, rollout_id: str, messages: Sequence[Any], turns: Sequence[dict[str, Any]] = (),
                      model: str = "policy") -> int:
    """The chain of `messages` (ChatMessages or dicts) for a rollout built by hand, as the episode's activities
    store it: the i-th assistant message carries `turns[i]`'s token data (prompt_token_ids, generation_token_ids,
    generation_log_probs, policy_version, attempt, usage). Returns its head id, for `RolloutRecord.head_id`."""
    from gymflow.kernel.store.episodes import NewMessage, append_messages
    from gymflow.kernel.store.repo import driver

    pending = iter(turns)
    new = []
    for m in messages:
        body = m if isinstance(m, dict) else m.model_dump(exclude_none=True)
        turn = next(pending, None) if body["role"] == "assistant" else None
        tokens = None if turn is None else {"attempt": 1, "model": model,
                                            **{k: v for k, v in turn.items() if k != "turn"}}
        new.append(NewMessage(role=body["role"], body=body, tokens=tokens))
    ids = await append_messages(await driver(session), rollout_id=rollout_id, parent_id=None,
                                producer=f"test/{rollout_id}", messages=new)
    return ids[-1]
