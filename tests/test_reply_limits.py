"""What one model reply may bring (limits.max_reply_chars, limits.max_tool_calls_per_turn), and secrets a model
or a tool echoes, redacted before anything is stored. Through the real stack."""

from __future__ import annotations

import json

from gymflow.testing.scripted_openai import Reply, text, tool_call
from tests.conftest import API_KEY
from tests.helpers import user_task, weather_task


def _limited(inp, **limits):
    return inp.model_copy(update={"limits": inp.limits.model_copy(update=limits)})


async def test_a_reply_over_max_reply_chars_fails_typed_and_is_not_stored(gf, scripted, sql, run_id):
    scripted.script(text("x" * 5_000))
    inp = _limited(gf.make_input(run_id, user_task("talk", task_id="long"), 0, "policy"), max_reply_chars=1_000)
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.failure_type) == ("failed", "reply_too_large"), summary
    assert "5000 characters" in (summary.failure_message or "")
    ((status, ftype, transcript),) = sql("SELECT status, failure_type, transcript FROM rollouts WHERE id = %s",
                                         inp.rollout_id)
    assert (status, ftype) == ("failed", "reply_too_large")
    assert all(m["role"] != "assistant" for m in transcript)  # the reply never reached the store
    assert sql("SELECT count(*) FROM messages WHERE rollout_id = %s AND role = 'assistant'", inp.rollout_id) == [(0,)]


async def test_tool_call_arguments_count_toward_max_reply_chars(gf, scripted, run_id):
    scripted.script(tool_call("get_weather", {"city": "y" * 3_000}))
    inp = _limited(gf.make_input(run_id, weather_task(), 0, "policy"), max_reply_chars=1_000)
    summary = await gf.run_rollout(inp)
    assert summary.failure_type == "reply_too_large"


async def test_too_many_tool_calls_in_one_reply_fail_typed_and_none_runs(gf, scripted, sql, run_id):
    many = [("get_weather", json.dumps({"city": f"c{i}"})) for i in range(10)]
    scripted.script(Reply(content=None, tool_calls=many))
    inp = _limited(gf.make_input(run_id, weather_task(), 0, "policy"), max_tool_calls_per_turn=3)
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.failure_type, summary.tool_calls) == ("failed", "too_many_tool_calls", 0)
    assert "10 tool calls" in (summary.failure_message or "")
    assert sql("SELECT count(*) FROM messages WHERE rollout_id = %s AND role = 'tool'", inp.rollout_id) == [(0,)]


async def test_calls_within_the_limit_all_run(gf, scripted, run_id):
    calls = [("get_weather", json.dumps({"city": f"c{i}"})) for i in range(3)]
    scripted.script(Reply(content=None, tool_calls=calls), text("done"))
    inp = _limited(gf.make_input(run_id, weather_task(), 0, "policy"), max_tool_calls_per_turn=3)
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.tool_calls) == ("completed", 3)


async def test_a_model_echoing_its_api_key_has_it_redacted_in_the_store(gf, scripted, sql, run_id):
    scripted.script(tool_call("get_weather", {"city": f"my key is {API_KEY}"}), text(f"the key: {API_KEY}!"))
    inp = gf.make_input(run_id, weather_task(), 0, "policy")
    assert (await gf.run_rollout(inp)).status == "completed"
    stored = json.dumps(sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)) + json.dumps(
        sql("SELECT body FROM messages WHERE rollout_id = %s", inp.rollout_id)) + json.dumps(
        sql("SELECT message FROM generations WHERE rollout_id = %s", inp.rollout_id))
    assert API_KEY not in stored
    assert "[redacted: $GYMFLOW_TEST_API_KEY]" in stored
    # The tool echoed the (redacted) argument back: its output, stored, holds no key either.
    assert "the key: [redacted: $GYMFLOW_TEST_API_KEY]!" in stored


def test_the_redactor_replaces_longest_secrets_first_and_ignores_short_values():
    from gymflow.activities.redact import Redactor

    r = Redactor({"A": "secret-value-1234", "B": "secret-value-1234-and-more", "C": "short"})
    assert r.text("x secret-value-1234-and-more y secret-value-1234 z short") == \
        "x [redacted: $B] y [redacted: $A] z short"
    assert r.body({"content": ["secret-value-1234"], "n": 3}) == {"content": ["[redacted: $A]"], "n": 3}
