"""Whatever a model server answers, a rollout ends completed or failed with a known type: fuzzed replies
(non-JSON, HTML, partial chat completions, NUL bytes, huge content, odd tool calls) through the real stack."""

from __future__ import annotations

import itertools
import json
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gymflow.kernel.failures import FAILURE_TYPES, MAX_MESSAGE_CHARS
from gymflow.testing.scripted_openai import Reply, completion_json, raw_body, text
from tests.helpers import user_task

RUN_ID = "fuzz-" + uuid.uuid4().hex[:8]
_ids = itertools.count()

# Text with the characters that break things: NUL, other controls, quotes, non-BMP.
nasty_text = st.text(alphabet=st.sampled_from(["a", " ", "\x00", "\n", '"', "\\", "{", "é", "😀", "\x7f"]),
                     max_size=40)
json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | nasty_text,
                           lambda kids: st.lists(kids, max_size=3) | st.dictionaries(nasty_text, kids, max_size=3),
                           max_leaves=8)


@st.composite
def tool_calls(draw: st.DrawFn) -> list[dict[str, Any]]:
    name = draw(st.sampled_from(["get_weather", "", "get_weather\x00", "x" * 300]) | nasty_text)
    args = draw(st.sampled_from(['{"city": "SF"}', '{"city": "S\\u0000F"}', "{", "[]", "null"])
                | nasty_text | json_values.map(json.dumps))
    call: dict[str, Any] = {"id": draw(st.sampled_from(["call_1", "", None])), "type": "function",
                            "function": {"name": name, "arguments": args}}
    return [draw(st.sampled_from([call, {"function": None}, {"id": "c"}, "call"]))]


@st.composite
def completions(draw: st.DrawFn) -> dict[str, Any]:
    """A chat completion with parts missing, null or of the wrong type."""
    message: dict[str, Any] = {"role": "assistant"}
    message["content"] = draw(st.none() | nasty_text | st.just("\x00" * 5) | st.just("long " * 20_000)
                              | json_values)
    if draw(st.booleans()):
        message["tool_calls"] = draw(tool_calls())
    choice: dict[str, Any] = {"index": 0, "finish_reason": draw(st.sampled_from(["stop", "tool_calls", None, 7])),
                              "message": draw(st.sampled_from([message, message, None, "text", []]))}
    body: dict[str, Any] = {"id": "x", "object": "chat.completion",
                            "choices": draw(st.sampled_from([[choice], [choice], [], None, {"0": choice}]))}
    if draw(st.booleans()):
        usages = [{"prompt_tokens": 1, "completion_tokens": 2}, None, {"prompt_tokens": "x"}]
        body["usage"] = draw(st.sampled_from(usages))
    if draw(st.booleans()):
        del body["choices"]
    return body


replies = st.one_of(
    completions().map(completion_json),
    json_values.map(completion_json),
    st.binary(max_size=120).map(lambda b: raw_body(b, "application/json")),
    st.just(raw_body("<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")),
    st.builds(raw_body, nasty_text, st.sampled_from(["text/plain", "application/json", ""])),
    nasty_text.map(text),
)


@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(script=st.lists(st.tuples(replies, st.sampled_from([1, 4])), min_size=1, max_size=2))
async def test_any_model_reply_ends_typed(gf, scripted, sql, script: list[tuple[Reply, int]]):
    scripted.reset()
    # Each reply once (a retry then gets the next) or 4 times (every attempt of a turn: TEST_LIMITS).
    scripted.script(*(reply for reply, times in script for _ in range(times)))
    inp = gf.make_input(RUN_ID, user_task("weather?", task_id=f"fuzz-{next(_ids)}"), 0, "policy", max_turns=3)
    # The same 4 attempts per turn, with no waiting between them: what a reply turns into does not depend on it.
    generate = inp.limits.generate.model_copy(update={"initial_backoff_s": 0.01, "max_backoff_s": 0.02})
    inp = inp.model_copy(update={"limits": inp.limits.model_copy(update={"generate": generate})})
    summary = await gf.run_rollout(inp)
    assert summary.status in ("completed", "failed"), summary
    rows = sql("SELECT status, failure_type, failure_message FROM rollouts WHERE id = %s", inp.rollout_id)
    assert len(rows) == 1 and rows[0][0] in ("completed", "failed"), rows
    status, ftype, message = rows[0]
    if status == "failed":
        assert ftype in FAILURE_TYPES, f"not a known failure type: {ftype!r} ({message})"
        assert message and len(message) <= MAX_MESSAGE_CHARS and "Traceback" not in message
    else:
        assert ftype is None or ftype in FAILURE_TYPES
    desc = await gf.temporal.get_workflow_handle(inp.rollout_id).describe()
    assert desc.status is not None and desc.status.name in ("COMPLETED", "FAILED")
