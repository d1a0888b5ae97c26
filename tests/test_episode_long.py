"""A long episode through the real stack (issue 7's measure, shortened): 60 turns of 50 KB tool outputs on a
100 KB task, continued as new every 20 turns.

History must grow by a constant per turn, across continue-as-new runs, and every payload must stay under a bound
that depends on none of the sizes; the data (the 3 MB transcript) lives in Postgres (docs/architecture.md,
"Long episodes").
"""

from __future__ import annotations

import json

import pytest

from gymflow.kernel.wire import ChatMessage
from gymflow.testing.scripted_openai import text, tool_call
from tests.faulty_env import faulty_env, faulty_task  # noqa: F401 - faulty_env is a fixture
from tests.test_episode_workflow import _payload_sizes

PAYLOAD_BOUND = 1_500  # bytes: ids, counters and short strings (the largest measured: ~950)


async def _history_bytes(ep, rollout_id: str) -> int:
    total = 0
    async for wf in ep.temporal.list_workflows(f"WorkflowId = '{rollout_id}'"):  # continue-as-new runs too
        history = await ep.temporal.get_workflow_handle(rollout_id, run_id=wf.run_id).fetch_history()
        total += len(history.to_json())
    return total


async def _runs(ep, rollout_id: str) -> int:
    return len([wf async for wf in ep.temporal.list_workflows(f"WorkflowId = '{rollout_id}'")])


async def _episode(ep, scripted, run_id: str, name: str, turns: int, output_bytes: int, task_bytes: int,
                   turns_per_run: int | None = None):
    task = faulty_task(name)
    task = task.model_copy(update={"messages": (ChatMessage(role="system", content="p" * task_bytes),
                                                *task.messages)})
    scripted.script(*[tool_call("blob", {"size": output_bytes}) for _ in range(turns - 1)], text("done"))
    inp = ep.make_input(run_id, task, 0, "policy", max_turns=turns).model_copy(
        update={"turns_per_run": turns_per_run})
    summary = await ep.run_rollout(inp)
    assert summary.status == "completed" and summary.turns == turns, summary
    return inp.rollout_id


@pytest.mark.usefixtures("faulty_env")
async def test_60_turns_of_50kb_outputs_on_a_100kb_task(ep, scripted, sql, run_id):
    turns, outputs = 60, 59
    small = await _episode(ep, scripted, run_id, "small", 10, 10, 10, turns_per_run=10)
    large = await _episode(ep, scripted, run_id, "large", turns, 50_000, 100_000, turns_per_run=20)
    assert await _runs(ep, large) == 3  # continued as new twice: the bounds below hold across runs
    small_per_turn = await _history_bytes(ep, small) / 10
    large_per_turn = await _history_bytes(ep, large) / turns
    print(f"\nhistory bytes per turn: {small_per_turn:.0f} (10 tiny turns), {large_per_turn:.0f} ({turns} turns of "
          f"50 KB outputs on a 100 KB task)")
    # Linear: the same bytes per turn whatever the sizes (the large one's ids and counters have more digits).
    assert abs(large_per_turn - small_per_turn) / small_per_turn < 0.15, (small_per_turn, large_per_turn)  # ~9%
    sizes = await _payload_sizes(ep, large)
    print(f"largest payload: {max(sizes)} bytes")
    assert max(sizes) < PAYLOAD_BOUND, max(sizes)
    # ...while Postgres holds the whole episode, exactly once: 59 outputs of 50 KB and the task.
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", large)[0]
    assert len(transcript) == 2 + 2 * outputs + 1
    assert sum(len(m.get("content") or "") for m in transcript if m["role"] == "tool") == outputs * 50_000
    assert len(json.dumps(transcript)) > outputs * 50_000 + 100_000
    assert sql("SELECT count(*) FROM generations WHERE rollout_id = %s", large) == [(turns,)]
