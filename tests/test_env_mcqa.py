"""The mcqa environment: NeMo Gym 0.7.0's example rows and rollouts, its grading modes, bad rows, hostile answers."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.mcqa import MCQAEnvironment
from gymflow.environments.mcqa_extract import boxed_inner, strip_text_wrappers

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import TaskError, VerifierError
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, FunctionCall, Task, ToolCall

DATA = Path(__file__).parent / "data" / "nemo_gym" / "mcqa"
ENV = MCQAEnvironment()
OPTS = [{letter: f"opt{letter}"} for letter in "ABCD"]
TEN = [{letter: f"option {letter} text"} for letter in "ABCDEFGHIJ"]


def make_task(expected: str = "B", options: list | None = None, **fields) -> Task:
    data = {"options": OPTS if options is None else options, "expected_answer": expected, **fields}
    return Task(id="t", env="mcqa", messages=(ChatMessage(role="user", content="Q?"),), data=data)


async def score(text: str | None, task: Task | None = None, **options):
    task = task or make_task()
    final = ChatMessage(role="assistant", content=text)
    return await ENV.verify(ENV.parse_task(task), (*task.messages, final), {}, VerifyContext("m", options=options))


def prompt_key(row: dict) -> str:
    return json.dumps([(m.get("role"), m.get("content")) for m in row["responses_create_params"]["input"]])


def joined(tasks: str, rollouts: str) -> list[tuple[Task, dict]]:
    """NeMo Gym's rollout rows omit `options`: pair each with its task row by prompt."""
    by_prompt = {prompt_key(json.loads(line)): json.loads(line) for line in (DATA / tasks).open()}
    out = []
    for line in (DATA / rollouts).open():
        rollout = json.loads(line)
        out.append((row_to_task(by_prompt[prompt_key(rollout)], env="mcqa", default_id="r"), rollout))
    return out


# ---- NeMo Gym's example rows and rollouts ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["example.jsonl", "example_with_template_metadata.jsonl"])
async def test_example_rows_load_and_gold_scores_one(name):
    tasks, errors = load_jsonl(DATA / name, env="mcqa")
    assert not errors and len(tasks) == 5
    for task in tasks:
        assert (await ENV.validate(task)).reward == 1.0
        wrong = next(k for o in task.data["options"] for k in o if k != task.data["expected_answer"])
        assert (await score(f"\\boxed{{{wrong}}}", task)).reward == 0.0


ROLLOUTS = [("example.jsonl", "example_rollouts.jsonl"),
            ("example_with_template_metadata.jsonl", "example_rollouts_with_template_metadata.jsonl")]


@pytest.mark.parametrize("tasks, rollouts", ROLLOUTS)
async def test_recorded_rollouts_score_as_nemo_gym_0_7_0(tasks, rollouts):
    for task, rollout in joined(tasks, rollouts):
        messages = (*task.messages, *input_to_messages(rollout["response"]["output"], "response.output"))
        s = await ENV.verify(ENV.parse_task(task), messages, {}, VerifyContext("m"))
        reward, letter = rollout["reward"], rollout["extracted_answer"]
        if rollout["expected_answer"] == "C" and rollout["reward"] == 0.0:
            # Recorded by an older verifier: 0.7.0 reads `\boxed{C: <option text>}` as C (its test
            # test_leading_letter_colon_then_wrapped_text; running 0.7.0's verify on this row gives 1.0 and C).
            assert "\\boxed{\nC: An individual" in messages[-1].content
            reward, letter = 1.0, "C"
        assert (s.reward, s.details["extracted_answer"]) == (reward, letter)


# ---- grading modes (NeMo Gym's decisions) --------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("The answer is C.", None),                         # strict needs a box
    ("Final: \\boxed{ [C] }", "C"),
    ("\\boxed{\\text{C}}", "C"),
    ("\\boxed{\\text{C: optC}}", "C"),
    ("\\[ \\boxed{C: \\text{optC}} \\]", "C"),
    ("\\boxed{C) optC}", "C"),
    ("\\boxed{c}", None),                               # a lower-case box is not a letter
    ("\\boxed{A polygenic score}", None),               # option text is lenient_boxed's job
    ("\\boxed{C} then \\boxed{D}", "D"),                # the last box wins
    ("\\boxed{\\text{idea}} so \\boxed{C}", "C"),
    ("\\boxed{C", None),                                # never closed
    ("\\boxed{E}", None),                               # not an option
    ("\\boxed{{C}}", "C"),
])
async def test_strict_single_letter_boxed(text, expected):
    s = await score(text, make_task("C"))
    assert s.details["extracted_answer"] == expected and s.reward == (1.0 if expected == "C" else 0.0)


@pytest.mark.parametrize("text, expected", [
    ("Final: \\boxed{ optC }", "C"),
    ("\\boxed{\\text{ OPTC  }}", "C"),
    ("\\boxed{C}", "C"),
    ("\\boxed{optC or optD}", None),                    # two options match: none
    ("optC", None),                                     # only inside a box
])
async def test_lenient_boxed(text, expected):
    s = await score(text, make_task("C", grading_mode="lenient_boxed"))
    assert s.details["extracted_answer"] == expected


@pytest.mark.parametrize("text, expected", [
    ("Answer: c", "C"),
    ("Answer: optC", "C"),
    ("answer :\n\n  B", "B"),
    ("Answer: C\nAnswer: D", "C"),                      # the first one, in this mode
    ("**Answer: C**", None),
    ("I think C", None),
])
async def test_lenient_answer_colon(text, expected):
    s = await score(text, make_task("C", grading_mode="lenient_answer_colon"))
    assert s.details["extracted_answer"] == expected


@pytest.mark.parametrize("text, expected", [
    ("The answer is B.\n\nAnswer: B", "B"),
    ("Reasoning.\n\n**Answer: C**", "C"),
    ("__Answer__: A", "A"),
    ("Answer: B because C is not valid", "B"),
    ("Answer: B/B", "B"),
    ("Answer: $D$", "D"),
    ("Answer: (D)", "D"),
    ("Answer: A/B/C", None),
    ("Answer: A or B", None),
    ("Answer: A, B", None),
    ("Answer: A\nAnswer: B", "B"),
    ("Answer: B\nAnswer: unknown", "B"),                # an unreadable last payload falls back to the one before
    ("Answer: G", None),
    ("\\boxed{B}", None),                               # no box fallback without a row prefix
])
async def test_run_option_lenient_answer_colon_md(text, expected):
    s = await score(text, make_task("B"), grading_mode="lenient_answer_colon_md")
    assert s.details["extracted_answer"] == expected and s.details["grading_mode"] == "lenient_answer_colon_md"


@pytest.mark.parametrize("text, prefix, expected", [
    ("The answer is (C).", "answer is", "C"),
    ("Die Antwort ist (D).", "Die Antwort ist", "D"),
    ("答えは（C）です。", "答えは", "C"),
    ("답은 (G)입니다", "답은", "G"),
    ("答えは A/D/E/F です。", "答えは", None),
    ("\\boxed{H}", "answer is", "H"),                  # with a prefix, the last box is the fallback
])
async def test_md_mode_answer_prefix(text, prefix, expected):
    task = make_task(expected or "A", TEN, template_metadata={"output_regex": "NEVER_MATCH_([A-Z])",
                                                              "answer_prefix": prefix})
    s = await score(text, task, grading_mode="lenient_answer_colon_md")
    assert s.details["extracted_answer"] == expected


async def test_run_option_overrides_row_mode():
    text = "I think the answer is B.\n\nAnswer: B"
    assert (await score(text)).reward == 0.0
    assert (await score(text, grading_mode="lenient_answer_colon")).reward == 1.0


@pytest.mark.parametrize("regex, text, expected", [
    (r"Option Selected:\s*([A-Za-z])", "Option Selected: B", "B"),
    (r"ANSWER IS\s*([A-Za-z])", "answer is b", "B"),                 # case-insensitive
    (r"Answer:\s*([A-Za-z])", "Maybe Answer: A? Final Answer: B", "B"),  # the last match
    ([r"Answer\s*:\s*([A-Za-z])", r"Antwort\s*:\s*([A-Za-z])"], "Antwort: B", "B"),
    ([r"الإجابة:\s*([أ-د])"], "الإجابة: ب", "B"),
    (r"Final Choice:\s*([A-Za-z])", "Final Choice: Z", "Z"),          # a regex letter is trusted
    (r"Pick:\s*(\w+)", "Pick: optB", "B"),                             # or one option's text
    (r"Final Choice:\s*([A-Za-z])", "\\boxed{B}", "B"),                # no match: the row's mode
])
async def test_template_output_regex_comes_first(regex, text, expected):
    s = await score(text, make_task("B", template_metadata={"output_regex": regex}))
    assert s.details["extracted_answer"] == expected


async def test_template_regex_without_options():
    task = make_task("B", [], template_metadata={"output_regex": r"Selected:\s*([A-Za-z])"})
    assert (await score("Selected: B", task)).reward == 1.0
    assert (await ENV.validate(task)).reward == 1.0


# ---- bad rows and bad settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("data, field", [
    ({"expected_answer": "B"}, "options"),
    ({"options": OPTS}, "expected_answer"),
    ({"options": OPTS, "expected_answer": "BC"}, "expected_answer"),
    ({"options": OPTS, "expected_answer": "F"}, "expected_answer"),
    ({"options": [{"A": 1}], "expected_answer": "A"}, "options.0.A"),
    ({"options": [], "expected_answer": "A"}, "options"),
    ({"options": OPTS, "expected_answer": "B", "grading_mode": "lenient_answer_colon_md"}, "grading_mode"),
    ({"options": OPTS, "expected_answer": "B", "template_metadata": {"output_regex": "(["}}, "output_regex[0]"),
    ({"options": OPTS, "expected_answer": "B", "template_metadata": {"output_regex": "(a)(b)"}}, "output_regex[0]"),
    ({"options": OPTS, "expected_answer": "B", "template_metadata": {"output_regex": []}}, "output_regex"),
    ({"options": OPTS, "expected_answer": "B", "template_metadata": {"answer_prefix": 3}}, "answer_prefix"),
])
def test_bad_rows_name_the_field(data, field):
    with pytest.raises(TaskError, match=field.replace("[", r"\[")):
        ENV.parse_task(Task(id="t", env="mcqa", messages=(ChatMessage(role="user", content="Q"),), data=data))


@pytest.mark.parametrize("options, message", [
    ({"grading_mode": "fuzzy"}, "grading_mode"), ({"regex_timeout_s": 0}, "regex_timeout_s"),
    ({"regex_timeout_s": "1"}, "regex_timeout_s"),
])
async def test_bad_run_options_mask_the_rollout(options, message):
    with pytest.raises(VerifierError, match=message) as err:
        await score("\\boxed{B}", **options)
    assert err.value.failure_type == "config_error"


# ---- hostile answers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [None, "", "   \n", "\x00\\boxed{\x00}", "(a+)+$ [A-Z]{2,} \\1 (?P<x>"])
async def test_odd_answers_score_zero(text):
    for mode in ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"):
        assert (await score(text, make_task("B", grading_mode=mode))).reward == 0.0


async def test_nul_bytes_around_a_right_answer():
    assert (await score("\x00" * 1000 + "\\boxed{B}\x00")).reward == 1.0
    assert (await score("\\boxed{B\x00}")).reward == 1.0  # NUL is padding around the letter, as in NeMo Gym


HUGE = 1_500_000  # about the largest transcript a rollout may carry


@pytest.mark.parametrize("mode, text", [
    ("strict_single_letter_boxed", "\\boxed{" * (HUGE // 7) + "B"),
    ("strict_single_letter_boxed", "\\boxed{" + "\\text{" * (HUGE // 12) + "B" + "}" * (HUGE // 12 + 1)),
    ("strict_single_letter_boxed", "\\boxed{" + "}{" * (HUGE // 2)),
    ("lenient_boxed", "\\boxed{" + "optA " * (HUGE // 5) + "}"),
    ("lenient_answer_colon", "answer" + " " * HUGE + ":"),
    ("lenient_answer_colon_md", "Answer: " + "answer is " * (HUGE // 10)),
    ("lenient_answer_colon_md", "Answer: " + "A " * (HUGE // 2)),
    ("lenient_answer_colon_md", "Answer: " + " B" * (HUGE // 2)),
])
async def test_huge_answers_take_linear_time(mode, text):
    task = make_task("B", template_metadata={"output_regex": "NEVER_([A-Z])", "answer_prefix": "answer is"})
    started = time.monotonic()
    s = await score(text, task, grading_mode=mode)
    assert s.reward in (0.0, 1.0)
    assert time.monotonic() - started < 10  # quadratic scans of these take minutes to hours


async def test_backtracking_row_regex_masks_instead_of_hanging():
    # NeMo Gym's own example pattern backtracks quadratically on a long run of spaces after "Answer:"
    task = make_task("B", template_metadata={"output_regex": r"Answer\s*:\s*(?!Answer)\s*([A-Za-z])\s*"})
    started = time.monotonic()
    with pytest.raises(VerifierError, match=r"output_regex\[0\] ran past 0.2s"):
        await score("Answer:" + " " * 200_000 + "1", task, regex_timeout_s=0.2)
    assert time.monotonic() - started < 5


async def test_tool_calls_without_text_score_zero():
    task = make_task()
    call = ChatMessage(role="assistant",
                       tool_calls=(ToolCall(id="c", function=FunctionCall(name="x", arguments="{}")),))
    assert (await ENV.verify(ENV.parse_task(task), (*task.messages, call), {}, VerifyContext("m"))).reward == 0.0


def test_box_and_wrapper_helpers():
    assert boxed_inner("\\boxed{a{b}c} \\boxed{d{e}}") == "d{e}"
    assert boxed_inner("\\boxed{a{b}") is None
    assert strip_text_wrappers("\\text{ \\text{E} }") == "E"
    assert strip_text_wrappers("\\text{a} and \\text{b}") == "a} and \\text{b"  # whole-string wrappers only
