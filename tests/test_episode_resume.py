"""`gymflow resume` on the by-reference workflow: the reset run continues from the head it had, writes under its
own producer keys, and the stored transcript and generations are exactly the accepted chain."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from gymflow.kernel.wire import RolloutSummary
from gymflow.resume import resume_run
from gymflow.testing.scripted_openai import http_error, text, tool_call
from tests.helpers import weather_task


async def _replays_and_is_kept(history: WorkflowHistory, name: str) -> None:
    """The reset run's history replays through the strict sandbox."""
    from gymflow.workflows.episode import EpisodeWorkflow

    result = await Replayer(workflows=[EpisodeWorkflow], data_converter=pydantic_data_converter).replay_workflow(
        history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


async def test_resume_continues_the_chain_from_the_failed_turn(ep, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "SF"}), *[http_error(503, "down")] * 4)
    inp = ep.make_input(run_id, weather_task(), 0, "policy")
    first = await ep.run_rollout(inp)
    assert first.status == "failed" and first.failure_type == "model_unavailable"
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool"]

    scripted.reset()
    scripted.script(text("It is cold."))
    resumed = []
    for _ in range(50):  # the dev server's visibility trails the close by a moment
        resumed = await resume_run(ep.temporal, run_id, reason="test")
        if resumed:
            break
        await asyncio.sleep(0.1)
    assert [r.note for r in resumed] == ["resumed"]
    handle = ep.temporal.get_workflow_handle(inp.rollout_id, result_type=RolloutSummary)
    summary = await handle.result()
    assert summary.status == "completed" and summary.reward == 1.0
    await _replays_and_is_kept(await handle.fetch_history(), "episode_failed_then_reset")
    assert len(scripted.requests) == 1, "only the failed generation ran again"
    assert [m["role"] for m in scripted.requests[0].body["messages"]] == ["system", "user", "assistant", "tool"]
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    assert [m["role"] for m in transcript] == ["system", "user", "assistant", "tool", "assistant"]
    assert sql("SELECT turn, message->>'content' FROM generations WHERE rollout_id = %s ORDER BY turn",
               inp.rollout_id)[1:] == [(1, "It is cold.")]
