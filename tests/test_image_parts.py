"""Image prompts: Chat Completions content parts in ChatMessage, the Responses `input_image` conversion both ways,
hostile parts refused naming the field, and NeMo Gym's image servers' example rows (circle_click, circle_count,
gui_coordinate, in the NeMo Gym wheel) loading and rebuilding as recorded."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import pytest
from gymflow.activities.completion import request_body
from gymflow.environments.nemo_gym import NemoGymEnvironment
from gymflow.environments.nemo_gym_responses import create_params
from pydantic import ValidationError

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.config import ModelConfig
from gymflow.kernel.errors import TaskError
from gymflow.kernel.limits import MAX_IMAGE_URL_CHARS
from gymflow.kernel.responses_format import content_to_input, input_to_messages, validation_message
from gymflow.kernel.wire import (
    ChatMessage,
    GenerateRequest,
    ImagePart,
    ImageURL,
    Task,
    TextPart,
    content_chars,
    image_url_problem,
    shown_content,
)
from gymflow.localmodel.request import BadRequest, parse_request
from gymflow.reports.profile import _loads_back, task_to_row
from gymflow.testing.scripted_openai import text, tool_call
from tests.faulty_env import ending_env  # noqa: F401 - a fixture
from tests.test_episode_end import replays

PNG = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n tiny").decode()
IMAGE = {"type": "input_image", "image_url": PNG, "detail": "auto"}


def _user(*parts: Any) -> list[dict[str, Any]]:
    return [{"role": "system", "content": "Look."}, {"role": "user", "content": list(parts)}]


def _error(inp: Any) -> str:
    with pytest.raises(TaskError) as e:
        input_to_messages(inp)
    return str(e.value)


# ---- the wire type ----------------------------------------------------------------------------------------------


def test_a_plain_string_message_is_unchanged_byte_for_byte() -> None:
    m = ChatMessage(role="user", content="hi")
    assert m.model_dump_json() == ('{"role":"user","content":"hi","tool_calls":null,"tool_call_id":null,"name":null,'
                                   '"reasoning_content":null}')
    assert m.to_openai() == {"role": "user", "content": "hi"}
    assert m.text == "hi"


def test_parts_round_trip_through_json_and_go_to_the_model_as_chat_parts() -> None:
    body = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                                        {"type": "text", "text": "How many?"}]}
    m = ChatMessage.model_validate(body)
    assert m.content == (ImagePart(image_url=ImageURL(url=PNG, detail="low")), TextPart(text="How many?"))
    assert ChatMessage.model_validate_json(m.model_dump_json()) == m  # what Temporal's converter does
    assert m.to_openai() == body
    assert m.text == "How many?"
    assert content_chars(m.content) == len(PNG) + len("How many?")
    stored = json.loads(json.dumps(m.model_dump(exclude_none=True)))  # as the store keeps the body
    assert stored["content"][0] == {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}}
    assert ChatMessage.model_validate(stored) == m
    assert shown_content(stored["content"]) == "[image_url]How many?"


@pytest.mark.parametrize("url, problem", [
    ("https://example.com/cat.png", "images are not downloaded at run time"),
    ("http://127.0.0.1/x.png", "images are not downloaded at run time"),
    ("file:///etc/passwd", "expected a data:image/<png|jpeg|gif|webp>;base64,... URL"),
    ("data:image/svg+xml;base64,PHN2Zz4=", "unsupported media type image/svg+xml"),
    ("data:text/html;base64,PGI+", "expected a data:image/"),
    ("data:image/png,raw", "expected a data:image/"),  # not base64-encoded
    ("data:image/png;base64,", "payload is not base64"),
    ("data:image/png;base64,not base64!", "payload is not base64"),
    ("data:image/png;base64,abc", "payload is not base64"),  # cut short
    ("data:image/png;base64," + "A" * MAX_IMAGE_URL_CHARS, f"at most {MAX_IMAGE_URL_CHARS:,} (MAX_IMAGE_URL_CHARS)"),
])
def test_bad_image_urls_are_refused_saying_why(url: Any, problem: str) -> None:
    assert problem in (image_url_problem(url) or "")
    with pytest.raises(ValidationError) as e:
        ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]})
    message = validation_message(e.value, "messages[1]")
    assert message.startswith("messages[1].content[0].image_url.url: "), message
    assert problem in message


def test_an_image_url_must_be_a_string() -> None:
    assert image_url_problem(42) == "expected a data:image/<png|jpeg|gif|webp>;base64,... URL, got int"
    with pytest.raises(ValidationError, match="valid string"):
        ImageURL.model_validate({"url": 42})


@pytest.mark.parametrize("media", ["png", "jpeg", "gif", "webp"])
def test_each_accepted_media_type_passes(media: str) -> None:
    assert image_url_problem(f"data:image/{media};base64,R0lGODlh") is None


@pytest.mark.parametrize("content, where, problem", [
    ([{"type": "audio", "data": "x"}], "messages[0].content[0]", "expected a part of type 'text' or 'image_url'"),
    (["just a string"], "messages[0].content[0]", "expected a part of type 'text' or 'image_url'"),
    ([{"type": "text"}], "messages[0].content[0].text", "Field required"),
    ([{"type": "text", "text": 3}], "messages[0].content[0].text", "valid string"),
    ([{"type": "image_url", "image_url": PNG}], "messages[0].content[0].image_url", "valid dictionary"),
    ([{"type": "image_url", "image_url": {"url": PNG, "detail": "max"}}],
     "messages[0].content[0].image_url.detail", "'auto', 'low' or 'high'"),
    ([], "messages[0].content", "at least one content part"),
    (7, "messages[0].content", "expected a string or a list of content parts"),
])
def test_wrong_parts_name_their_field(content: Any, where: str, problem: str) -> None:
    with pytest.raises(ValidationError) as e:
        ChatMessage.model_validate({"role": "user", "content": content})
    message = validation_message(e.value, "messages[0]")
    assert message.startswith(f"{where}: "), message
    assert problem in message


@pytest.mark.parametrize("role", ["system", "assistant", "tool"])
def test_only_user_messages_hold_images(role: str) -> None:
    with pytest.raises(ValidationError, match="only user messages may hold images"):
        ChatMessage.model_validate({"role": role, "content": [{"type": "image_url", "image_url": {"url": PNG}}]})
    # text parts are fine in any role
    assert ChatMessage.model_validate({"role": role, "content": [{"type": "text", "text": "x"}]}).text == "x"


def test_the_model_call_sends_the_parts_as_the_chat_api_takes_them() -> None:
    messages = tuple(input_to_messages(_user(IMAGE, {"type": "input_text", "text": "How many?"})))
    body = request_body(ModelConfig(base_url="http://127.0.0.1:9/v1", model="m"),
                        GenerateRequest(rollout_id="r/t/0", turn=0, model="m", messages=messages))
    assert json.loads(json.dumps(body["messages"])) == [
        {"role": "system", "content": "Look."},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
                                     {"type": "text", "text": "How many?"}]}]


def test_the_local_model_refuses_image_parts_with_a_400() -> None:
    m = ChatMessage.model_validate({"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG}}]})
    with pytest.raises(BadRequest, match=r"messages\[0\]\.content\[0\].*this model reads text only") as e:
        parse_request({"messages": [m.to_openai()]})
    assert e.value.status == 400


# ---- Responses <-> chat -----------------------------------------------------------------------------------------


def test_input_image_becomes_an_image_part_in_order_and_comes_back_as_the_row_had_it() -> None:
    text = {"type": "input_text", "text": "How many pink circles?"}
    system, user = input_to_messages(_user(IMAGE, text))
    assert system.content == "Look."
    assert user.content == (ImagePart(image_url=ImageURL(url=PNG, detail="auto")), TextPart(text=text["text"]))
    assert content_to_input(user.content) == [IMAGE, text]
    no_detail = {"type": "input_image", "image_url": PNG}
    assert content_to_input(input_to_messages(_user(no_detail))[1].content) == [no_detail]


def test_text_only_parts_still_make_a_plain_string() -> None:
    parts = [{"type": "input_text", "text": "a"}, {"type": "output_text", "text": "b"}, "c", {"text": "d"}]
    (m,) = input_to_messages([{"role": "user", "content": parts}])
    assert m.content == "abcd"
    assert content_to_input(m.content) == "abcd"


@pytest.mark.parametrize("part, where, problem", [
    ({"type": "input_image", "image_url": "https://example.com/a.png"}, ".image_url",
     "images are not downloaded at run time"),
    ({"type": "input_image", "image_url": "data:image/bmp;base64,Qk0="}, ".image_url",
     "unsupported media type image/bmp"),
    ({"type": "input_image", "image_url": "data:image/png;base64," + "A" * MAX_IMAGE_URL_CHARS}, ".image_url",
     "(MAX_IMAGE_URL_CHARS)"),
    ({"type": "input_image", "image_url": {"url": PNG}}, ".image_url", "got dict"),
    ({"type": "input_image"}, ".image_url", "required"),
    ({"type": "input_image", "file_id": "file-123"}, ".file_id", "uploaded files are not supported"),
    ({"type": "input_image", "image_url": PNG, "detail": "max"}, ".detail", "expected one of auto, low, high"),
    ({"type": "input_audio", "input_audio": {}}, "", "expected a text part"),
    (5, "", "expected a text or image part"),
])
def test_bad_input_parts_name_their_field(part: Any, where: str, problem: str) -> None:
    message = _error(_user(part))
    assert message.startswith(f"responses_create_params.input[1].content[0]{where}: "), message
    assert problem in message


@pytest.mark.parametrize("sampling", [{}, {"temperature": 0.5}])
def test_a_task_with_an_image_writes_a_row_that_loads_back_as_it(sampling: dict[str, Any]) -> None:
    # gymflow profile --out-tasks: a chat `messages` row, or a Responses row when the task has sampling settings
    params = {"input": _user(IMAGE, {"type": "input_text", "text": "How many?"}), **sampling}
    task = row_to_task({"id": "t1", "env": "nemo_gym", "responses_create_params": params}, env=None, default_id="t")
    row = task_to_row(task)
    assert ("responses_create_params" in row) == bool(sampling)
    assert _loads_back(json.loads(json.dumps(row)), task)


def test_an_image_outside_a_user_message_is_refused() -> None:
    message = _error([{"role": "developer", "content": [IMAGE]}])
    assert message.startswith("responses_create_params.input[0].content: an image in a developer message")


# ---- NeMo Gym's image servers -----------------------------------------------------------------------------------

SERVERS_DIR = Path(__file__).resolve().parents[1] / ".nemo313/lib/python3.13/site-packages/resources_servers"
IMAGE_SERVERS = ("circle_click", "circle_count", "gui_coordinate")
FILES = ("example.jsonl", "example_rollouts.jsonl")
if not SERVERS_DIR.exists() and os.environ.get("GYMFLOW_REQUIRE_NEMO_GYM") == "1":
    raise RuntimeError(f"GYMFLOW_REQUIRE_NEMO_GYM=1 but no NeMo Gym wheel at {SERVERS_DIR}")
needs_wheel = pytest.mark.skipif(not SERVERS_DIR.exists(), reason=f"no NeMo Gym wheel at {SERVERS_DIR} (.ci/run)")


@needs_wheel
@pytest.mark.parametrize("server", IMAGE_SERVERS)
@pytest.mark.parametrize("name", FILES)
def test_the_image_servers_rows_load_and_rebuild_as_recorded(server: str, name: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{**json.loads(line), "resources_server": server}
            for line in (SERVERS_DIR / server / "data" / name).read_text().splitlines() if line.strip()]
    assert len(rows) == 5
    if name == "example.jsonl":  # a rollout file loads after `gymflow data join`; its rows convert the same
        dataset = tmp_path / name
        dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
        tasks, errors = load_jsonl(dataset, env="nemo_gym")
        assert not errors, [str(e) for e in errors[:3]]
        assert len(tasks) == 5
    monkeypatch.setenv(f"GYMFLOW_NEMO_GYM_{server.upper()}_URL", "http://127.0.0.1:9")  # no server is needed
    env = NemoGymEnvironment()
    for row in rows:
        want = row["responses_create_params"]["input"]
        assert any(isinstance(p, dict) and p.get("type") == "input_image"
                   for item in want for p in (item["content"] if isinstance(item["content"], list) else ()))
        task = row_to_task(row, env="nemo_gym", default_id="t")
        assert any(isinstance(m.content, tuple) for m in task.messages)
        sent = env.parse_task(task).row()["responses_create_params"]["input"]
        assert sent == create_params(task)["input"]
        # What /verify gets is the row's input (the message items gain their `type`, as before images).
        assert [{k: v for k, v in item.items() if k != "type"} for item in sent] == \
            [{k: v for k, v in item.items() if k != "type"} for item in want]


# ---- through the real stack -------------------------------------------------------------------------------------


async def test_an_image_prompt_reaches_the_model_as_parts_and_is_stored_as_them(gf, ending_env, scripted, sql,  # noqa: F811
                                                                                 run_id):
    messages = input_to_messages(_user(IMAGE, {"type": "input_text", "text": "finish the task"}))
    task = Task(id="img0", env=ending_env, messages=tuple(messages))
    scripted.script(tool_call("submit", {"text": "42"}), text("never"))
    inp = gf.make_input(run_id, task, 0, "policy")
    summary = await gf.run_rollout(inp)
    assert summary.status == "completed" and summary.reward == 1.0, summary
    sent = scripted.requests[0].body["messages"]
    assert sent[1]["content"] == [{"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
                                  {"type": "text", "text": "finish the task"}]
    (transcript,), = sql("SELECT transcript FROM rollouts WHERE id = %s", inp.rollout_id)
    assert ChatMessage.model_validate(transcript[1]) == messages[1]
    await replays(gf, inp.rollout_id)  # the workflow's history, image and all, replays
