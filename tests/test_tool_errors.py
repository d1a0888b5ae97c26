"""Bad tool calls go back to the model as tool messages; the episode goes on."""

from __future__ import annotations

from gymflow.testing.scripted_openai import text, tool_call
from tests.helpers import weather_task


async def _run(gf, scripted, sql, run_id, bad_call):
    scripted.script(bad_call, tool_call("get_weather", {"city": "SF"}), text("cold"))
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed" and summary.turns == 3 and summary.reward == 1.0
    (transcript,) = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)[0]
    tool_msgs = [m for m in transcript if m["role"] == "tool"]
    # the second request carried the error back to the model
    seen = scripted.requests[1].body["messages"][-1]
    assert seen["role"] == "tool" and seen["content"] == tool_msgs[0]["content"]
    return tool_msgs[0]["content"]


async def test_malformed_json_arguments_reach_the_model(gf, scripted, sql, run_id):
    content = await _run(gf, scripted, sql, run_id, tool_call("get_weather", '{"city": "SF"'))
    assert content.startswith("Error: arguments are not valid JSON")


async def test_unknown_tool_reaches_the_model(gf, scripted, sql, run_id):
    content = await _run(gf, scripted, sql, run_id, tool_call("launch_rockets", {"n": 3}))
    assert content == "Error: unknown tool 'launch_rockets'; available: get_weather"


async def test_huge_tool_output_is_truncated_for_the_model(gf, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "x" * 150_000}), text("cold"))
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    assert (await gf.run_rollout(inp)).status == "completed"
    seen = scripted.requests[1].body["messages"][-1]["content"]
    assert len(seen) < 100_100 and seen.endswith("more characters]")


async def test_transcript_over_the_payload_budget_fails_typed_and_is_recorded(gf, scripted, sql, run_id):
    scripted.script(*[tool_call("get_weather", {"city": "y" * 3_000}) for _ in range(3)], text("done"))
    inp = gf.make_input(run_id, weather_task(), 0, "policy", max_turns=10)
    limits = inp.limits.model_copy(update={"max_episode_bytes": 10_000})
    summary = await gf.run_rollout(inp.model_copy(update={"limits": limits}))
    assert summary.status == "failed" and summary.failure_type == "transcript_too_large"
    assert summary.reward is None
    ((status, ftype, n),) = sql("SELECT status, failure_type, jsonb_array_length(transcript) FROM rollouts "
                                "WHERE id = %s", inp.rollout_id)
    assert (status, ftype) == ("failed", "transcript_too_large") and n >= 2
