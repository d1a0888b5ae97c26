"""The xlam_fc environment: NeMo Gym 0.7.0's example rows and rollouts, its matching rule, bad rows, hostile calls."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gymflow.activities.recorded import split_turns
from gymflow.environments.base import VerifyContext
from gymflow.environments.xlam_fc import XlamFcEnvironment

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import TaskError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall, ToolSpec

DATA = Path(__file__).parent / "data" / "nemo_gym" / "xlam_fc"
ENV = XlamFcEnvironment()
TOOLS = tuple(ToolSpec(name=n, description="", parameters={"type": "object", "properties": {}}) for n in ("f", "g"))


def make_task(expected: list, tools: tuple = TOOLS) -> Task:
    return Task(id="t", env="xlam_fc", messages=(ChatMessage(role="user", content="do it"),), tools=tools,
                data={"expected_answers": expected})


def calls(*pairs: tuple[str, object]) -> ChatMessage:
    """An assistant turn; a dict argument is JSON-encoded, a string is sent as is."""
    return ChatMessage(role="assistant", tool_calls=tuple(
        ToolCall(id=f"c{i}", function=FunctionCall(name=n, arguments=a if isinstance(a, str) else json.dumps(a)))
        for i, (n, a) in enumerate(pairs)))


async def score(expected: list, *turns: ChatMessage):
    task = make_task(expected)
    return await ENV.verify(ENV.parse_task(task), (*task.messages, *turns), {}, VerifyContext("m"))


def prompt_key(row: dict) -> str:
    return json.dumps([(m.get("role"), m.get("content")) for m in row["responses_create_params"]["input"]])


def joined() -> list[tuple[Task, dict]]:
    """NeMo Gym's rollout rows omit `expected_answers`: pair each with its task row by prompt."""
    by_prompt = {prompt_key(json.loads(line)): json.loads(line) for line in (DATA / "example.jsonl").open()}
    return [(row_to_task(by_prompt[prompt_key(r)], env="xlam_fc", default_id="r"), r)
            for r in map(json.loads, (DATA / "example_rollouts.jsonl").open())]


# ---- NeMo Gym's example rows and rollouts ------------------------------------------------------------------


async def test_example_rows_load_and_gold_scores_one():
    tasks, errors = load_jsonl(DATA / "example.jsonl", env="xlam_fc")
    assert not errors and len(tasks) == 5
    for task in tasks:
        assert (await ENV.validate(task)).reward == 1.0
        data = ENV.parse_task(task)
        first = data.expected_answers[0]
        wrong = {**first.arguments, next(iter(first.arguments)): "not this"}
        s = await ENV.verify(data, (*task.messages, calls((first.name, wrong))), {}, VerifyContext("m"))
        assert s.reward == 0.0


async def test_recorded_rollouts_score_as_nemo_gym():
    rows = joined()
    assert sorted(r["reward"] for _, r in rows) == [0.0, 0.0, 1.0, 1.0, 1.0]
    for task, rollout in rows:
        data = ENV.parse_task(task)
        whole = (*task.messages, *input_to_messages(rollout["response"]["output"], "response.output"))
        first_turn = (*task.messages, split_turns(rollout["response"]["output"])[0])  # where our episode ends
        for messages in (whole, first_turn):
            s = await ENV.verify(data, messages, {}, VerifyContext("m"))
            got = (s.reward, s.details["num_expected"], s.details["num_predicted"], s.details["num_correct"])
            assert got == (rollout["reward"], rollout["num_expected"], rollout["num_predicted"],
                           rollout["num_correct"])
            assert s.details["predicted_names"] == [c["name"] for c in rollout["predicted_calls"]]


async def test_a_tool_call_ends_the_episode_without_running_anything():
    task = make_task([{"name": "f", "arguments": {"x": 1}}])
    out = await ENV.call_tool(ENV.parse_task(task), {}, "f", {"x": 1})
    assert out.done is True and "Not executed" in out.content


# ---- the matching rule ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("expected, turns, reward", [
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("f", {"x": 1}))], 1.0),
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("f", {"x": 1, "extra": 2}))], 1.0),   # extras ignored
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("f", {"x": "1"}))], 0.0),             # types matter
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("f", {}))], 0.0),
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("g", {"x": 1}))], 0.0),
    ([{"name": "f", "arguments": {"x": 1}}], [calls(("f", {"x": 1}), ("f", {"x": 1}))], 0.0),  # one too many
    ([{"name": "f", "arguments": {"x": 1}}], [ChatMessage(role="assistant", content="f(x=1)")], 0.0),
    ([{"name": "f", "arguments": {"x": 1}}, {"name": "f", "arguments": {"x": 2}}],
     [calls(("f", {"x": 2}), ("f", {"x": 1}))], 1.0),                                       # any order
    ([{"name": "f", "arguments": {"x": 1}}, {"name": "g"}], [calls(("f", {"x": 1})), calls(("g", {"y": 0}))], 1.0),
    ([], [ChatMessage(role="assistant", content="No function fits.")], 1.0),               # no call expected
    ([], [calls(("f", {}))], 0.0),
    ([{"name": "f", "arguments": '{"x": 1}'}], [calls(("f", {"x": 1}))], 1.0),             # JSON-string gold
    # NeMo Gym's greedy order: the argument-free expectation takes the first f, and {"x": 1} finds none left
    ([{"name": "f"}, {"name": "f", "arguments": {"x": 1}}], [calls(("f", {"x": 1}), ("f", {"x": 2}))], 0.0),
])
async def test_matching(expected, turns, reward):
    assert (await score(expected, *turns)).reward == reward


# ---- bad rows --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data, field", [
    ({}, "expected_answers"),
    ({"expected_answers": {"name": "f"}}, "expected_answers"),
    ({"expected_answers": [{"arguments": {}}]}, "expected_answers.0.name"),
    ({"expected_answers": [{"name": ""}]}, "expected_answers.0.name"),
    ({"expected_answers": [{"name": "f", "arguments": "{bad"}]}, "expected_answers.0.arguments"),
    ({"expected_answers": [{"name": "f", "arguments": "[1]"}]}, "expected_answers.0.arguments"),
    ({"expected_answers": [{"name": "f"}, {"name": "h"}]}, "expected_answers.1.name"),    # not an offered tool
])
def test_bad_rows_name_the_field(data, field):
    with pytest.raises(TaskError, match=field.replace(".", r"\.")):
        ENV.parse_task(Task(id="t", env="xlam_fc", messages=(ChatMessage(role="user", content="q"),), tools=TOOLS,
                            data=data))


def test_single_tool_rows_are_not_xlam_rows():
    row = json.loads((Path(__file__).resolve().parents[2] / "shared" / "data" / "nemo_gym" /
                      "example_single_tool_call" / "example.jsonl").open().readline())
    with pytest.raises(TaskError, match="expected_answers"):
        ENV.parse_task(row_to_task(row, env="xlam_fc", default_id="w"))


# ---- hostile calls ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("arguments", [
    "{bad json", "[1, 2]", "3", "null", '"x"', "[" * 100_000 + "]" * 100_000, '{"x": NaN}', "1" * 5000,
    '{"x": "\\u0000"}', "\x00", "",
])
async def test_hostile_arguments_are_a_wrong_call(arguments):
    s = await score([{"name": "f", "arguments": {"x": 1}}], calls(("f", arguments)))
    assert (s.reward, s.details["num_predicted"], s.details["num_correct"]) == (0.0, 1, 0)


async def test_a_flood_of_calls_is_scored_quickly():
    flood = calls(*[("f", {"x": i, "pad": "y" * 100}) for i in range(5000)])
    started = time.monotonic()
    s = await score([{"name": "f", "arguments": {"x": 4999}}], flood)
    assert (s.reward, s.details["num_predicted"], s.details["num_correct"]) == (0.0, 5000, 1)
    assert len(s.details["predicted_names"]) == 20 and time.monotonic() - started < 5
