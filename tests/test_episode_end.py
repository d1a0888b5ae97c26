"""Episode end: an environment ends the episode (a terminal tool, or its own stop rule), and a row carries
its own turn limit. Through the real stack."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from gymflow.workflows.episode import EpisodeWorkflow
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from gymflow.client import GymflowClient
from gymflow.data.datasets import load_jsonl
from gymflow.kernel.wire import ChatMessage, RolloutSummary, Task
from gymflow.testing.scripted_openai import Reply, text, tool_call
from tests.faulty_env import ENDING_NAME, ending_env  # noqa: F401 - ending_env is a fixture


@pytest_asyncio.fixture
async def client(gf: GymflowClient, ending_env: str) -> AsyncIterator[GymflowClient]:  # noqa: F811
    yield gf


def ending_task(task_id: str = "e0", **update: object) -> Task:
    task = Task(id=task_id, env=ENDING_NAME, messages=(ChatMessage(role="user", content="finish the task"),))
    return task.model_copy(update=update)


def calls(*pairs: tuple[str, dict[str, object] | str]) -> Reply:
    """One assistant turn with several tool calls, in order."""
    return Reply(content=None, tool_calls=[(n, a if isinstance(a, str) else json.dumps(a)) for n, a in pairs])


async def run(client: GymflowClient, task: Task, run_id: str, **kw: object) -> tuple[RolloutSummary, str]:
    inp = client.make_input(run_id, task, 0, "policy", **kw)  # type: ignore[arg-type]
    return await client.run_rollout(inp), inp.rollout_id


async def replays(client: GymflowClient, rollout_id: str) -> None:
    """The new branch (`done`) is deterministic: the episode's own history replays."""
    history = await client.temporal.get_workflow_handle(rollout_id).fetch_history()
    replayer = Replayer(workflows=[EpisodeWorkflow], data_converter=pydantic_data_converter)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_a_terminal_tool_ends_the_episode(client, scripted, sql, run_id):
    scripted.script(tool_call("echo", {"text": "a"}),
                    # mark_task_complete, then a call after it in the same turn: answered, never run
                    calls(("mark_task_complete", {}), ("echo", {"text": "late"})),
                    # the model would keep going: these must not be asked for
                    tool_call("echo", {"text": "never"}), text("never"))
    summary, rid = await run(client, ending_task(), run_id)
    assert summary.status == "completed" and summary.reward == 1.0, summary
    assert (summary.turns, summary.tool_calls) == (2, 2)
    assert len(scripted.requests) == 2
    transcript, details = sql("SELECT transcript, score_details FROM rollouts WHERE id = %s", rid)[0]
    assert [m["role"] for m in transcript] == ["user", "assistant", "tool", "assistant", "tool", "tool"]
    assert transcript[-2]["content"] == "marked complete"
    assert transcript[-1]["content"] == "Not run: the episode ended with the call to 'mark_task_complete'."
    assert transcript[-1]["tool_call_id"] == transcript[-3]["tool_calls"][1]["id"]
    # verify saw the terminal call, and the state without the call that was not run
    assert details == {"called": ["echo", "mark_task_complete", "echo"], "last_role": "tool", "echoed": ["a"],
                       "submitted": None}
    await replays(client, rid)


async def test_the_environment_s_own_stop_rule_ends_the_episode(client, scripted, sql, run_id):
    scripted.script(tool_call("mark_task_complete", "{bad json"),  # a terminal call that failed: goes on
                    tool_call("submit", {"text": ""}),  # ToolError: the model sees it and goes on
                    tool_call("submit", {"text": "42"}),  # ToolOutput(done=True)
                    text("never"))
    summary, rid = await run(client, ending_task(), run_id)
    assert summary.status == "completed" and summary.reward == 1.0, summary
    assert (summary.turns, summary.tool_calls) == (3, 3)
    assert len(scripted.requests) == 3
    transcript, details = sql("SELECT transcript, score_details FROM rollouts WHERE id = %s", rid)[0]
    assert [m["content"].split(":")[0] for m in transcript if m["role"] == "tool"] == ["Error", "Error",
                                                                                     "submitted 42"]
    assert details["submitted"] == "42" and details["last_role"] == "tool"
    await replays(client, rid)


async def test_a_row_turn_limit_stops_the_episode(client, scripted, sql, run_id, tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"id": "short", "env": ENDING_NAME, "max_turns": 1,
                                "messages": [{"role": "user", "content": "go"}]}) + "\n")
    (task,), errors = load_jsonl(path, env=None)
    assert errors == [] and task.max_turns == 1 and "max_turns" not in task.data
    scripted.script(*[tool_call("echo", {"text": str(i)}) for i in range(4)])
    summary, rid = await run(client, task, run_id)  # the run allows 4 turns
    assert summary.status == "completed" and (summary.turns, summary.tool_calls) == (1, 1), summary
    assert len(scripted.requests) == 1
    assert sql("SELECT score_details->'echoed' FROM rollouts WHERE id = %s", rid) == [(["0"],)]


def test_the_row_limit_only_lowers_the_run_s(gf):
    assert gf.make_input("r", ending_task(max_turns=2), 0, "policy").max_turns == 2  # run default: 4
    assert gf.make_input("r", ending_task(max_turns=9), 0, "policy").max_turns == 4
    assert gf.make_input("r", ending_task(max_turns=9), 0, "policy", max_turns=6).max_turns == 6
    assert gf.make_input("r", ending_task(max_turns=3), 0, "policy", max_turns=6).max_turns == 3
    assert gf.make_input("r", ending_task(), 0, "policy", max_turns=6).max_turns == 6


@pytest.mark.parametrize("value, got", [(0, "0"), (-1, "-1"), ("x", "a string"), (1.5, "1.5"),
                                        (True, "a boolean"), ([2], "an array")])
def test_a_bad_row_turn_limit_is_a_line_numbered_error(tmp_path, value, got):
    path = tmp_path / "d.jsonl"
    ok = {"messages": [{"role": "user", "content": "hi"}]}
    path.write_text("\n".join(json.dumps(r) for r in [ok, {**ok, "max_turns": value}, {**ok, "max_turns": None},
                                                      {**ok, "max_turns": 3}]))
    tasks, errors = load_jsonl(path, env="single_tool")
    assert [(t.id, t.max_turns) for t in tasks] == [("d-1", None), ("d-3", None), ("d-4", 3)]
    assert [str(e) for e in errors] == [f"{path}:2: max_turns: expected a positive integer, got {got}"]


def test_a_retried_run_tools_reports_the_end_its_first_attempt_stored():
    from gymflow.activities.episode import _tools_ran

    ran = _tools_ran(7, [{}, {"is_error": True}, {"done": True}, {"not_run": True}])
    assert (ran.head_id, ran.calls, ran.errors, ran.done) == (7, 3, 1, True)
    assert not _tools_ran(7, [{}]).done
