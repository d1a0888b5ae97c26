"""A hostile model endpoint (issue "Hardening, round two"): its error text, ids, finish reasons, token fields and
numbers, through the real stack (Temporal dev server, Postgres, the scripted OpenAI-compatible server). Whatever it
sends, the key stays out of the store, history and log; a reply that walks around a limit fails typed, at once;
its numbers are its failure (model_bad_response), never an internal or infrastructure one."""

from __future__ import annotations

import json
import logging
import time

import pytest

from gymflow.testing.scripted_openai import Reply, completion_json, http_error, raw_body, text, tool_call
from tests.conftest import API_KEY
from tests.helpers import readable_history, user_task, weather_task

REDACTED = "[redacted: $GYMFLOW_TEST_API_KEY]"


def _limited(inp, **limits):
    return inp.model_copy(update={"limits": inp.limits.model_copy(update=limits)})


def _completion(message: dict, finish_reason: str = "stop", **extra) -> dict:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": finish_reason}
    choice.update(extra.pop("choice", {}))
    return {"id": "x", "object": "chat.completion", "model": "m", "choices": [choice],
            "usage": extra.pop("usage", {"prompt_tokens": 3, "completion_tokens": 2}), **extra}


def _stored(sql, rollout_id: str) -> str:
    return json.dumps(sql("SELECT * FROM rollouts WHERE id = %s", rollout_id), default=str) + json.dumps(
        sql("SELECT body, state, tokens FROM messages WHERE rollout_id = %s", rollout_id), default=str) + json.dumps(
        sql("SELECT * FROM generations WHERE rollout_id = %s", rollout_id), default=str)


async def _history(gf, rollout_id: str) -> str:
    history = await gf.temporal.get_workflow_handle(rollout_id).fetch_history()
    return readable_history(history.to_json())


@pytest.mark.parametrize("status", [400, 404, 422])
async def test_an_endpoints_error_text_quoting_the_key_is_redacted_in_store_history_and_log(
        gf, scripted, sql, run_id, caplog, status):
    caplog.set_level(logging.WARNING)
    scripted.script(http_error(status, f"invalid request for key {API_KEY} (see docs)"))
    inp = gf.make_input(run_id, user_task("hi", task_id=f"err{status}"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.failure_type) == ("failed", "model_bad_request"), summary
    assert REDACTED in (summary.failure_message or "")
    assert API_KEY not in _stored(sql, inp.rollout_id)
    assert API_KEY not in await _history(gf, inp.rollout_id)
    assert API_KEY not in caplog.text


async def test_a_non_json_200_quoting_the_key_is_redacted_before_it_is_cut(gf, scripted, sql, run_id, caplog):
    caplog.set_level(logging.WARNING)
    # The key starts inside the 80 characters quoted: cut first, a prefix of it would pass a by-value redactor.
    body = "<html>" + "x" * 60 + API_KEY + "</html>"
    scripted.script(*[raw_body(body, content_type="text/html")] * 4)  # every attempt (max_attempts 4)
    inp = gf.make_input(run_id, user_task("hi", task_id="html"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.failure_type == "model_bad_response", summary
    assert "[redacted" in (summary.failure_message or "")
    key_prefix = API_KEY[:12]
    for where in (_stored(sql, inp.rollout_id), await _history(gf, inp.rollout_id), caplog.text):
        assert key_prefix not in where


async def test_a_tool_call_id_and_finish_reason_holding_the_key_are_redacted_and_still_pair(
        gf, scripted, sql, run_id):
    call = {"id": f"call-{API_KEY}", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    scripted.script(completion_json(_completion({"content": None, "tool_calls": [call]}, finish_reason=API_KEY)),
                    text("done"))
    inp = gf.make_input(run_id, weather_task("idkey"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed", summary
    stored = _stored(sql, inp.rollout_id)
    assert API_KEY not in stored
    assert API_KEY not in await _history(gf, inp.rollout_id)
    rows = sql("SELECT role, body FROM messages WHERE rollout_id = %s ORDER BY position", inp.rollout_id)
    (assistant,) = [b for r, b in rows if r == "assistant" and b.get("tool_calls")]
    (tool,) = [b for r, b in rows if r == "tool"]
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"] == f"call-{REDACTED}"


@pytest.mark.parametrize("field", ["id", "finish_reason"])
async def test_a_huge_id_or_finish_reason_fails_reply_too_large_at_once(gf, scripted, sql, run_id, field):
    huge = "i" * 3_000_000
    call = {"id": huge if field == "id" else "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{}"}}
    scripted.script(completion_json(_completion({"content": None, "tool_calls": [call]},
                                                finish_reason=huge if field == "finish_reason" else "tool_calls")))
    inp = gf.make_input(run_id, weather_task(f"huge-{field}"), 0, "policy")
    started = time.monotonic()
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.failure_type) == ("failed", "reply_too_large"), summary
    assert time.monotonic() - started < 20  # not six workflow tasks failing on the payload limit first
    assert sql("SELECT count(*) FROM messages WHERE rollout_id = %s AND role = 'assistant'", inp.rollout_id) == [(0,)]


async def test_token_ids_that_were_not_asked_for_are_not_stored(gf, scripted, sql, run_id):
    ids = list(range(300_000))
    scripted.script(completion_json(_completion({"content": "hello"}, choice={"token_ids": ids,
                                                                                "prompt_token_ids": ids},
                                                prompt_token_ids=ids)))
    inp = gf.make_input(run_id, user_task("hi", task_id="unasked"), 0, "policy")  # return_token_ids: false
    assert (await gf.run_rollout(inp)).status == "completed"
    ((size,),) = sql("SELECT max(octet_length(tokens::text)) FROM messages WHERE rollout_id = %s", inp.rollout_id)
    assert size < 10_000, size


async def test_token_ids_count_toward_the_reply_limit(gf, scripted, run_id):
    ids = list(range(5_000))
    scripted.script(completion_json(_completion({"content": "hi"}, choice={"token_ids": ids})))
    inp = _limited(gf.make_input(run_id, user_task("hi", task_id="many-ids"), 0, "vllm"), max_reply_chars=1_000)
    summary = await gf.run_rollout(inp)
    assert summary.failure_type == "reply_too_large", summary
    assert "token ids" in (summary.failure_message or "")


@pytest.mark.parametrize("usage", [{"prompt_tokens": -5, "completion_tokens": 1},
                                   {"prompt_tokens": 10**30, "completion_tokens": 1}], ids=["negative", "huge"])
async def test_an_endpoints_impossible_usage_is_model_bad_response(gf, scripted, run_id, usage):
    scripted.script(*[completion_json(_completion({"content": "ok"}, usage=usage))] * 4)
    inp = gf.make_input(run_id, user_task("hi", task_id=f"usage-{usage['prompt_tokens'] < 0}"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert (summary.status, summary.failure_type) == ("failed", "model_bad_response"), summary


async def test_a_nan_logprob_is_model_bad_response_not_a_store_failure(gf, scripted, run_id):
    body = json.dumps(_completion({"content": "ok"}, choice={"logprobs": {"content": [{"token": "a",
                                                                                       "logprob": -1.0}]}}))
    body = body.replace("-1.0", "NaN")
    scripted.script(*[raw_body(body)] * 4)
    summary = await gf.run_rollout(gf.make_input(run_id, user_task("hi", task_id="nan-logprob"), 0, "policy"))
    assert summary.failure_type == "model_bad_response", summary


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
async def test_a_non_finite_tool_argument_is_a_tool_error_the_model_sees(gf, scripted, sql, run_id, constant):
    scripted.script(tool_call("get_weather", '{"city": "Paris", "days": ' + constant + '}'), text("done"))
    inp = gf.make_input(run_id, weather_task(f"nan-{constant}"), 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed", summary  # not store_unavailable
    ((tool,),) = sql("SELECT body FROM messages WHERE rollout_id = %s AND role = 'tool'", inp.rollout_id)
    assert constant.lstrip("-") in tool["content"] and "not a JSON number" in tool["content"]


def test_the_log_record_factory_redacts_every_logger_and_handler(caplog):
    from gymflow.activities import redact

    caplog.set_level(logging.INFO)
    redact.install(redact.Redactor({"K": API_KEY}))
    try:
        raise RuntimeError(f"boom {API_KEY}")
    except RuntimeError:
        logging.getLogger("some.library").warning("key=%s", API_KEY, exc_info=True)
    assert API_KEY not in caplog.text
    assert "key=[redacted: $K]" in caplog.text and "boom [redacted: $K]" in caplog.text


def test_reply_fields_that_are_not_text_are_bounded_where_read():
    from gymflow.activities.model_client import parse_completion
    from temporalio.exceptions import ApplicationError

    for bad in ({"prompt_tokens": -1}, {"completion_tokens": 2**40}):
        with pytest.raises(ApplicationError) as e:
            parse_completion(json.dumps(_completion({"content": "x"}, usage=bad)).encode(), "application/json", "m")
        assert e.value.type == "model_bad_response"
    with pytest.raises(ApplicationError) as e:
        parse_completion(b'{"choices": [{"message": {"content": "x"}, "x": Infinity}]}', "application/json", "m")
    assert "Infinity" in e.value.message


def test_the_episode_limit_counts_state_and_token_data():
    from gymflow.activities.chain_cache import new_message_size

    from gymflow.kernel.store.episodes import NewMessage

    plain = new_message_size(NewMessage(role="tool", body={"content": "x"}))
    with_state = new_message_size(NewMessage(role="tool", body={"content": "x"}, state={"mail": "y" * 10_000}))
    with_tokens = new_message_size(NewMessage(role="assistant", body={"content": "x"},
                                              tokens={"generation_token_ids": list(range(10_000))}))
    assert with_state > plain + 10_000 and with_tokens > plain + 10_000


async def test_the_state_is_stored_once_per_turn_not_on_every_tool_message(gf, scripted, sql, run_id):
    calls = [("get_weather", json.dumps({"city": f"c{i}"})) for i in range(5)]
    scripted.script(Reply(content=None, tool_calls=calls), text("done"))
    inp = gf.make_input(run_id, weather_task("state-once"), 0, "policy")
    assert (await gf.run_rollout(inp)).status == "completed"
    rows = sql("SELECT state IS NOT NULL FROM messages WHERE rollout_id = %s AND role = 'tool' ORDER BY position",
               inp.rollout_id)
    assert [r[0] for r in rows] == [False, False, False, False, True]
