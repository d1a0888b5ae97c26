"""A full single-tool episode through the real stack, read back with SQL."""

from __future__ import annotations

import json

from gymflow.testing.scripted_openai import text, tool_call
from tests.helpers import weather_task


async def test_single_tool_episode_persisted(gf, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": "San Francisco"}, logprobs=True),
                    text("It is cold in San Francisco.", logprobs=True, prompt_tokens=50))
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    summary = await gf.run_rollout(inp)

    assert summary.status == "completed" and summary.reward == 1.0
    rows = sql("SELECT status, reward, masked, turns, tool_calls, prompt_tokens, completion_tokens, transcript, "
               "attempts, latency_s FROM rollouts WHERE run_id = %s", run_id)
    assert len(rows) == 1
    status, reward, masked, turns, tools, ptok, ctok, transcript, attempts, latency = rows[0]
    assert (status, reward, masked, turns, tools) == ("completed", 1.0, False, 2, 1)
    assert ptok == 60 and ctok == 1 + 6 and attempts == 2 and latency > 0
    roles = [m["role"] for m in transcript]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert json.loads(transcript[3]["content"])["weather_description"] == "The weather in San Francisco is cold."
    gens = sql("SELECT turn, attempt, generation_log_probs FROM generations WHERE rollout_id = %s ORDER BY turn",
               inp.rollout_id)
    assert [(g[0], g[1]) for g in gens] == [(0, 1), (1, 1)]
    assert gens[1][2] == [-0.5] * 6
    # the model saw the tool, in Chat Completions shape, and the tool's answer on the second turn
    first, second = scripted.requests[0].body, scripted.requests[1].body
    assert first["tools"][0]["function"]["name"] == "get_weather"
    assert second["messages"][-1]["role"] == "tool"


async def test_no_tool_call_scores_zero_not_failed(gf, scripted, sql, run_id):
    scripted.script(text("Which city?"))
    summary = await gf.run_rollout(gf.make_input(run_id, weather_task(), 0, "policy"))
    assert summary.status == "completed" and summary.reward == 0.0
    assert sql("SELECT reward, turns FROM rollouts WHERE run_id = %s", run_id) == [(0.0, 1)]


async def test_token_ids_and_logprobs_stored_per_turn_for_trainers(gf, scripted, sql, run_id):
    # vLLM's return_token_ids: the trainer gets the exact prompt and generation ids, never re-tokenizes.
    scripted.script(tool_call("get_weather", {"city": "SF"}, logprobs=True, prompt_tokens=40, completion_tokens=7),
                    text("cold in SF", logprobs=True, prompt_tokens=60))
    inp = gf.make_input(run_id, weather_task(), 0, "vllm")
    assert (await gf.run_rollout(inp)).status == "completed"
    assert all(r.body.get("return_token_ids") is True and r.body.get("logprobs") is True for r in scripted.requests)
    rows = sql("SELECT turn, jsonb_array_length(prompt_token_ids), jsonb_array_length(generation_token_ids), "
               "jsonb_array_length(generation_log_probs), completion_tokens FROM generations "
               "WHERE rollout_id = %s ORDER BY turn", inp.rollout_id)
    assert rows == [(0, 40, 7, 7, 7), (1, 60, 3, 3, 3)]
