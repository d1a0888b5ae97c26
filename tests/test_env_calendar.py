"""The calendar environment: NeMo Gym's grading rules, the recorded example rewards, and the gold calendar."""

from __future__ import annotations

import json
import random
import re
import time
from pathlib import Path

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.calendar import CalendarEnvironment, extract_json_list, gold_calendar, to_minutes

from gymflow.data.datasets import load_jsonl
from gymflow.kernel.errors import TaskError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "nemo_gym" / "calendar"
ENV = CalendarEnvironment()

# Two events: 0 must sit between 10am and 11:45am, 1 must end by 1:45pm; both 60 minutes, 10:00-16:00.
EXPECTED = {
    "0": {"event_id": 0, "duration": 60, "constraint": "between 10am and 11:45am", "min_time": "10:00",
          "max_time": "16:00"},
    "1": {"event_id": 1, "duration": 60, "constraint": "before 1:45pm", "min_time": "10:00", "max_time": "16:00"},
}


def make_task(expected: dict = EXPECTED) -> Task:
    return Task(id="t", env="calendar", messages=(ChatMessage(role="user", content="plan my day"),),
                data={"exp_cal_state": expected})


def event(event_id: int, start: str, duration: int = 60) -> dict:
    return {"event_id": event_id, "event_name": f"e{event_id}", "start_time": start, "duration": duration}


async def score(answer: str | None, expected: dict = EXPECTED, *, final: ChatMessage | None = None):
    task = make_task(expected)
    final = final or ChatMessage(role="assistant", content=answer)
    return await ENV.verify(ENV.parse_task(task), (*task.messages, final), {}, VerifyContext("m"))


def calendar(*events: dict) -> str:
    return json.dumps(list(events))


# ---- right and wrong answers ----------------------------------------------------------------------------


async def test_right_calendar_scores_one():
    s = await score("Here you go:\n" + calendar(event(0, "10:00"), event(1, "11:00")) + "\nAnything else?")
    assert (s.reward, s.details["reason"]) == (1.0, "pass")


@pytest.mark.parametrize("events, rule", [
    ((event(0, "10:00", 45), event(1, "11:00")), "duration"),
    ((event(0, "09:30"), event(1, "11:00")), "window"),
    ((event(0, "10:00"), event(1, "15:30")), "window"),  # ends 16:30, past max_time
    ((event(0, "11:00"), event(1, "12:00")), "between"),  # ends 12:00, after 11:45
    ((event(0, "10:00"), event(1, "13:00")), "before"),  # ends 14:00, after 1:45pm
])
async def test_each_broken_constraint_is_named(events, rule):
    s = await score(calendar(*events))
    assert s.reward == 0.0
    assert s.details["reason"] == "constraint_violated" and s.details["rule"] == rule


async def test_after_and_at_constraints_are_named():
    expected = {
        "0": {"duration": 30, "constraint": "after 2pm", "min_time": "10:00", "max_time": "16:00"},
        "1": {"duration": 30, "constraint": "at 11:15am", "min_time": "10:00", "max_time": "16:00"},
    }
    ok = await score(calendar(event(0, "14:00", 30), event(1, "11:15", 30)), expected)
    early = await score(calendar(event(0, "13:45", 30), event(1, "11:15", 30)), expected)
    moved = await score(calendar(event(0, "14:00", 30), event(1, "11:30", 30)), expected)
    assert ok.reward == 1.0
    assert (early.reward, early.details["rule"], early.details["event_id"]) == (0.0, "after", "0")
    assert (moved.reward, moved.details["rule"], moved.details["event_id"]) == (0.0, "at", "1")


async def test_overlapping_events_conflict():
    s = await score(calendar(event(0, "10:00"), event(1, "10:30")))
    assert (s.reward, s.details["reason"], s.details["event_ids"]) == (0.0, "conflicting_events", [0, 1])


async def test_back_to_back_events_do_not_conflict():
    assert (await score(calendar(event(1, "11:00"), event(0, "10:00")))).reward == 1.0


async def test_wrong_number_of_events():
    s = await score(calendar(event(0, "10:00")))
    assert (s.reward, s.details["reason"], s.details["got"]) == (0.0, "different_number_of_events", 1)


async def test_missing_event_id_is_a_grading_error():
    s = await score(calendar(event(0, "10:00"), event(7, "11:00")))
    assert (s.reward, s.details["reason"]) == (0.0, "error_in_grading")


# ---- malformed, empty, <think> --------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    "[{'event_id': 0, 'start_time': '10:00', 'duration': 60}]",  # Python, not JSON
    '[{"event_id": 0, "start_time": "10:00", "duration": 60},]',  # trailing comma
    '[{"event_id": 0, "start_time": "10:00"',  # cut off
    "I have scheduled both events.",  # no list at all
    "[]",
    "[1, 2]",  # no object in the list
])
async def test_malformed_json_scores_zero(answer):
    s = await score(answer)
    assert (s.reward, s.details["reason"]) == (0.0, "no_json_list")


@pytest.mark.parametrize("events", [
    [{"event_id": 0, "start_time": "10:00", "duration": 60}, {"event_id": 1, "duration": 60}],  # no start_time
    [{"event_id": 0, "start_time": "10 o'clock", "duration": 60}, event(1, "11:00")],
    [{"event_id": 0, "start_time": "10:00", "duration": "60"}, event(1, "11:00")],
    [{"event_name": "no id", "start_time": "10:00", "duration": 60}],
])
async def test_wrong_shape_is_a_grading_error(events):
    s = await score(json.dumps(events))
    assert (s.reward, s.details["reason"]) == (0.0, "error_in_grading")


async def test_only_the_first_list_is_tried():
    # As NeMo: a broken first candidate is not rescued by a valid list later on.
    s = await score("[{'draft': 1}]\n" + calendar(event(0, "10:00"), event(1, "11:00")))
    assert s.details["reason"] == "no_json_list"


@pytest.mark.parametrize("answer", ["", None])
async def test_empty_answer_scores_zero(answer):
    s = await score(answer)
    assert (s.reward, s.details["reason"]) == (0.0, "no_answer")


async def test_tool_call_as_last_message_scores_zero():
    call = ToolCall(id="c", function=FunctionCall(name="f", arguments="{}"))
    final = ChatMessage(role="assistant", tool_calls=(call,))
    assert (await score(None, final=final)).details["reason"] == "no_answer"


async def test_think_left_in_answer_scores_zero():
    s = await score("<think>10:00 works</think>" + calendar(event(0, "10:00"), event(1, "11:00")))
    assert (s.reward, s.details["reason"]) == (0.0, "think_found")


async def test_no_expected_events_accepts_any_answer():
    assert (await score("Happy to help with anything else!", {})).reward == 1.0


# ---- times, extraction, task parsing --------------------------------------------------------------------


@pytest.mark.parametrize("text, minutes", [
    ("10am", 600), ("11:45am", 705), ("12pm", 720), ("12:30pm", 750), ("12am", 0), ("1:45pm", 825),
    ("4pm", 960), ("16:00", 960), (" 09:05 ", 545), ("10:30 am", 630),
])
def test_time_formats(text, minutes):
    assert to_minutes(text) == minutes


@pytest.mark.parametrize("text", ["10 o'clock", "10:00 AM", "10", "", 600, None])
def test_bad_times_raise(text):
    with pytest.raises(ValueError):
        to_minutes(text)


def test_extraction_matches_nemo_regex_on_random_text():
    # NeMo's pattern, used here only as the reference (it backtracks exponentially on some inputs).
    item = r"(?:[^\[\]]|\{[^}]*\})"
    nemo = re.compile(rf"\[{item}*\{{{item}*\}}{item}*\]", re.DOTALL)
    rnd = random.Random(7)
    for _ in range(3000):
        text = "".join(rnd.choice('[]{}a"1:,') for _ in range(rnd.randint(0, 14)))
        m = nemo.search(text)
        expected = None
        if m:
            try:
                expected = json.loads(m.group(0))
            except ValueError:
                expected = None
        assert extract_json_list(text) == expected, text


def test_extraction_is_linear_where_the_regex_is_not():
    start = time.perf_counter()
    assert extract_json_list("[" + "{}" * 20_000) is None
    assert time.perf_counter() - start < 1.0


def test_event_names_with_brackets_inside_objects():
    text = calendar(event(0, "10:00") | {"event_name": "Review [draft]"}, event(1, "11:00"))
    assert [e["event_id"] for e in extract_json_list(text)] == [0, 1]


@pytest.mark.parametrize("expected, field", [
    ({"0": {"duration": 60, "constraint": "around noon", "min_time": "10:00", "max_time": "16:00"}}, "constraint"),
    ({"0": {"duration": 60, "constraint": None, "min_time": "10", "max_time": "16:00"}}, "min_time"),
    ({"0": {"constraint": None, "min_time": "10:00", "max_time": "16:00"}}, "duration"),
])
def test_bad_rows_name_the_field(expected, field):
    with pytest.raises(TaskError, match=field):
        ENV.parse_task(make_task(expected))


def test_row_without_expected_state_is_rejected():
    with pytest.raises(TaskError, match="exp_cal_state"):
        ENV.parse_task(Task(id="t", env="calendar", messages=(), data={}))


# ---- gold calendar ---------------------------------------------------------------------------------------


async def test_validate_builds_a_gold_calendar():
    s = await ENV.validate(make_task())
    assert s is not None and s.reward == 1.0


async def test_validate_needs_reordering():
    # Greedy in id order puts 0 at 10:00 and then 1 ("at 10:30") cannot fit; the search reorders.
    expected = {
        "0": {"duration": 30, "constraint": None, "min_time": "10:00", "max_time": "11:00"},
        "1": {"duration": 30, "constraint": "at 10:00am", "min_time": "10:00", "max_time": "11:00"},
    }
    gold = gold_calendar(ENV.parse_task(make_task(expected)).exp_cal_state)
    assert gold is not None and [(e["event_id"], e["start_time"]) for e in gold] == [(1, "10:00"), (0, "10:30")]
    assert (await ENV.validate(make_task(expected))).reward == 1.0


async def test_validate_returns_none_when_no_calendar_fits():
    expected = {
        "0": {"duration": 60, "constraint": "at 10am", "min_time": "10:00", "max_time": "16:00"},
        "1": {"duration": 60, "constraint": "before 10:30am", "min_time": "10:00", "max_time": "16:00"},
    }
    assert await ENV.validate(make_task(expected)) is None


# ---- NeMo Gym parity: the example rows and their recorded rewards ----------------------------------------


def example_tasks() -> list[Task]:
    tasks, errors = load_jsonl(DATA / "example.jsonl", env="calendar")
    assert not errors and len(tasks) == 5
    return tasks


def final_text(response: dict) -> str:
    """The final assistant message's text in a Responses `output` (reasoning items come before it)."""
    last = [item for item in response["output"] if item.get("type") == "message"][-1]
    return "".join(part["text"] for part in last["content"] if part.get("type") == "output_text")


async def test_example_rollouts_reproduce_recorded_rewards():
    tasks = example_tasks()
    rows = [json.loads(line) for line in (DATA / "example_rollouts.jsonl").read_text().splitlines() if line]
    assert len(rows) == 5
    got = []
    for row in rows:
        # Rollout rows omit exp_cal_state: find their task by the conversation (the order differs).
        messages = tuple(input_to_messages(row["responses_create_params"]["input"]))
        task = next(t for t in tasks if t.messages == messages)
        answer = ChatMessage(role="assistant", content=final_text(row["response"]))
        s = await ENV.verify(ENV.parse_task(task), (*messages, answer), {}, VerifyContext("m"))
        got.append((task.id, s.reward, row["reward"], s.details["reason"]))
    assert [g[1] for g in got] == [g[2] for g in got], got
    assert sorted(g[1] for g in got) == [0.0, 0.0, 0.0, 1.0, 1.0]


@pytest.mark.parametrize("index", range(5))
async def test_validate_example_tasks(index):
    s = await ENV.validate(example_tasks()[index])
    assert s is not None and (s.reward, s.details["reason"]) == (1.0, "pass")
