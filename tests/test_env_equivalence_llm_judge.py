"""equivalence_llm_judge: NeMo Gym's rows load unchanged, the judge prompts we send are the ones NeMo Gym recorded,
rewards match its recorded rollouts (plain, swapped and full-generation passes), judge failures mask, and hostile
answers cannot hang or crash the verifier."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.equivalence_llm_judge import EquivalenceLLMJudgeEnvironment, extract, parse_verdict

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import TaskError, VerifierError
from gymflow.kernel.failures import CONFIG_ERROR, JUDGE_FAILED, JUDGE_UNAVAILABLE
from gymflow.kernel.wire import ChatMessage, Task
from tests.helpers import FakeJudge

DATA = Path(__file__).parent / "data" / "nemo_gym" / "equivalence_llm_judge"
ENV = "equivalence_llm_judge"
EQUAL, DIFFERENT = "Same thing.\n\n[[A=B]] they are equivalent", "No.\n\n[[A!=B]] they are not equivalent"
JUDGE = {"judge_model": "judge"}
OPENQA = {**JUDGE, "check_twice_swap": True, "check_full_generation_on_fail": True}


def rows(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def env() -> EquivalenceLLMJudgeEnvironment:
    return EquivalenceLLMJudgeEnvironment(judge_backoff_s=0)


def task(expected: str = "darwin", question: str = "Who proposed evolution by natural selection?",
         **data: Any) -> Task:
    return Task(id="t0", env=ENV, messages=(ChatMessage(role="user", content=question),),
                data={"expected_answer": expected, **data})


async def score(env: EquivalenceLLMJudgeEnvironment, t: Task, answer: str | None, judge: FakeJudge | None,
                options: dict[str, Any] | None = None):
    transcript = (*t.messages, ChatMessage(role="assistant", content=answer))
    return await env.verify(env.parse_task(t), transcript, {}, VerifyContext("policy", judge, options or JUDGE))


def recorded_answer(row: dict[str, Any]) -> str:
    for item in reversed(row["response"]["output"]):
        if item.get("type") == "message" and item.get("role") == "assistant":
            return "\n".join(c["text"] for c in item["content"] if isinstance(c.get("text"), str))
    return ""


def template_of(row: dict[str, Any], templates: list[dict[str, Any]]) -> dict[str, Any]:
    """Rollout rows omit `template_metadata`: find it by the prompt template their question was put in."""
    prompt = row["responses_create_params"]["input"][-1]["content"]
    for tm in templates:
        head, _, tail = tm["template_prompt"].partition("{problem}")
        if prompt.startswith(head) and prompt.endswith(tail):
            return {"template_metadata": tm}
    return {}


def judge_text(evaluation: dict[str, Any]) -> str:
    return evaluation["response"]["output"][-1]["content"][-1]["text"]


# ---- NeMo Gym's rows --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["example_openqa.jsonl"])
async def test_example_rows_load_unchanged_and_validate(env: EquivalenceLLMJudgeEnvironment, name: str) -> None:
    tasks, errors = load_jsonl(DATA / name, env=ENV)
    assert not errors and len(tasks) == 5
    for t in tasks:
        s = await env.validate(t)
        assert s is not None and s.reward == 1.0, (t.id, s)


# NeMo Gym's SciQ examples are CC-BY-NC-3.0 data: not shipped here (tests/data/nemo_gym/README.md).
@pytest.mark.parametrize(("name", "options"), [("example_rollouts_openqa.jsonl", OPENQA)])
async def test_replay_matches_nemo_gym_prompts_and_rewards(env: EquivalenceLLMJudgeEnvironment, name: str,
                                                           options: dict[str, Any]) -> None:
    templates = [r["template_metadata"] for r in rows(name.replace("_rollouts", "")) if "template_metadata" in r]
    for i, row in enumerate(rows(name)):
        t = row_to_task({**row, **template_of(row, templates)}, env=ENV, default_id=f"r{i}")
        evaluations = row["judge_evaluations"]
        judge = FakeJudge(*(judge_text(e) for e in evaluations))
        s = await score(env, t, recorded_answer(row), judge, options)
        assert s.reward == row["reward"], (name, i, s.details)
        assert len(judge.calls) == len(evaluations), (name, i)
        for (model, sent), recorded in zip(judge.calls, evaluations, strict=True):
            assert model == "judge"
            assert [(m.role, m.content) for m in sent] == [
                (m["role"], m["content"]) for m in recorded["responses_create_params"]["input"]], (name, i)
        assert [e["verdict_label"] for e in s.details["judge_evaluations"]] == [e["verdict_label"] for e in evaluations]


def test_rows_with_a_bad_field_are_rejected_by_field() -> None:
    env = EquivalenceLLMJudgeEnvironment()
    for data, field in [({}, "expected_answer"), ({"expected_answer": ""}, "expected_answer"),
                        ({"expected_answer": 7}, "expected_answer"),
                        ({"expected_answer": "x", "template_metadata": {"output_regex": "(("}}, "output_regex")]:
        with pytest.raises(TaskError, match=field):
            env.parse_task(Task(id="t", env=ENV, messages=(), data=data))
    ok = env.parse_task(Task(id="t", env=ENV, messages=(), data={"metadata": {"expected_answer": 3}}))
    assert ok.gold == "3"  # NeMo Gym's fallback


# ---- verdicts and extraction ------------------------------------------------------------------------


@pytest.mark.parametrize(("reply", "label", "issues"), [
    (EQUAL, "[[A=B]]", []), (DIFFERENT, "[[A!=B]]", []), ("no idea", None, ["no_verdict"]),
    ("[[A=B]] ... on reflection [[A!=B]]", "[[A!=B]]", ["conflicting_verdicts"]),
    ("[[A!=B]] then [[A=B]] [[A=B]]", "[[A=B]]", ["conflicting_verdicts", "repeated_verdict"]),
])
def test_last_label_wins(reply: str, label: str | None, issues: list[str]) -> None:
    assert parse_verdict(reply, "[[A=B]]", "[[A!=B]]") == (label, issues)


def test_labels_do_not_overlap() -> None:
    assert parse_verdict("The answer is INCORRECT", "CORRECT", "INCORRECT") == ("INCORRECT", [])
    assert parse_verdict("INCORRECT? No: CORRECT", "CORRECT", "INCORRECT")[0] == "CORRECT"


@pytest.mark.parametrize(("text", "pattern", "out"), [
    ("so ((42)) and ((43))", r"\(\((.*?)\)\)", "43"),
    ("no match here", r"\(\((.*?)\)\)", "no match here"),
    ("**  **", r"\*\*(.*?)\*\*", "**  **"),
    ("<a>x</a>", r"<a>(.*?)</a>|<b>(.*?)</b>", "x"),
])
def test_extract_last_match_first_nonempty_group(text: str, pattern: str, out: str) -> None:
    assert extract(text, pattern) == out


# ---- scoring ----------------------------------------------------------------------------------------


async def test_equal_and_different(env: EquivalenceLLMJudgeEnvironment) -> None:
    assert (await score(env, task(), "Charles Darwin", FakeJudge(EQUAL))).reward == 1.0
    s = await score(env, task(), "Lamarck", FakeJudge(DIFFERENT))
    assert s.reward == 0.0 and not s.masked and s.details["judge_evaluations"][0]["verdict_label"] == "[[A!=B]]"
    assert (await score(env, task(), "hmm", FakeJudge("I cannot decide"))).reward == 0.0


async def test_swap_check(env: EquivalenceLLMJudgeEnvironment) -> None:
    opts = {**JUDGE, "check_twice_swap": True, "reward_if_swap_fails": -1.0}
    judge = FakeJudge(EQUAL, DIFFERENT)
    s = await score(env, task("darwin"), "Charles Darwin", judge, opts)
    assert s.reward == -1.0 and len(judge.calls) == 2
    first, second = (c[1][-1].content for c in judge.calls)
    assert first.endswith("GOLD:\ndarwin\n\nCANDIDATE:\nCharles Darwin")
    assert second.endswith("GOLD:\nCharles Darwin\n\nCANDIDATE:\ndarwin")
    judge = FakeJudge(DIFFERENT)  # a first "different" is final: no swap
    assert (await score(env, task(), "x", judge, opts)).reward == 0.0 and len(judge.calls) == 1


async def test_full_generation_rescue_only_with_a_row_regex(env: EquivalenceLLMJudgeEnvironment) -> None:
    opts = {**JUDGE, "check_full_generation_on_fail": True, "reward_if_full_generation_succeeds": 0.5}
    row = task("42", template_metadata={"output_regex": r"\(\((.*?)\)\)"})
    judge = FakeJudge(DIFFERENT, EQUAL)
    s = await score(env, row, "forty-two, i.e. ((41))", judge, opts)
    assert s.reward == 0.5 and judge.calls[1][1][-1].content.endswith("CANDIDATE:\nforty-two, i.e. ((41))")
    judge = FakeJudge(DIFFERENT)
    assert (await score(env, task("42"), "41", judge, opts)).reward == 0.0 and len(judge.calls) == 1


async def test_long_gold_skips_row_regex_and_second_pass(env: EquivalenceLLMJudgeEnvironment) -> None:
    opts = {**OPENQA, "extraction_length_threshold": 10}
    row = task("a long gold answer", template_metadata={"output_regex": r"\(\((.*?)\)\)"})
    judge = FakeJudge(EQUAL)
    s = await score(env, row, "text ((short))", judge, opts)
    assert s.reward == 1.0 and len(judge.calls) == 1 and judge.calls[0][1][-1].content.endswith("text ((short))")


async def test_options_prompt_system_message_and_labels(env: EquivalenceLLMJudgeEnvironment) -> None:
    opts = {**JUDGE, "judge_system_message": "Be fair.", "judge_prompt_template": "Q={question} G={expected_answer} "
            "A={generated_answer}", "judge_equal_label": "CORRECT", "judge_not_equal_label": "INCORRECT",
            "question_extract_regex": r"^QUESTION:\s*(.*)$"}
    judge = FakeJudge("INCORRECT")
    s = await score(env, task("4", question="Context\nQUESTION: 2+2?"), "4", judge, opts)
    assert s.reward == 0.0
    assert [(m.role, m.content) for m in judge.calls[0][1]] == [("system", "Be fair."), ("user", "Q=2+2? G=4 A=4")]


@pytest.mark.parametrize("answer", ["", "  \n", None])
async def test_empty_answer_scores_zero_without_a_judge(env: EquivalenceLLMJudgeEnvironment,
                                                        answer: str | None) -> None:
    judge = FakeJudge()
    s = await score(env, task(), answer, judge)
    assert s.reward == 0.0 and s.details["failure_reason"] == "empty_final_answer" and not judge.calls


# ---- failures: masked, never 0 ----------------------------------------------------------------------


async def test_judge_failure_masks_after_bounded_retries(env: EquivalenceLLMJudgeEnvironment) -> None:
    judge = FakeJudge(ConnectionError("down"), ConnectionError("down"), ConnectionError("down"))
    with pytest.raises(VerifierError) as err:
        await score(env, task(), "Darwin", judge)
    assert err.value.failure_type == JUDGE_FAILED and len(judge.calls) == 3
    judge = FakeJudge(ConnectionError("blip"), EQUAL)  # a transient failure is retried
    assert (await score(env, task(), "Darwin", judge)).reward == 1.0


async def test_judge_reply_of_the_wrong_type_masks(env: EquivalenceLLMJudgeEnvironment) -> None:
    judge = FakeJudge(*[None] * 3)  # type: ignore[arg-type]
    with pytest.raises(VerifierError) as err:
        await score(env, task(), "Darwin", judge)
    assert err.value.failure_type == JUDGE_FAILED


async def test_no_judge_configured_masks(env: EquivalenceLLMJudgeEnvironment) -> None:
    for judge, options in [(None, JUDGE), (FakeJudge(), {})]:
        with pytest.raises(VerifierError) as err:
            await score(env, task(), "Darwin", judge, options or {"unrelated": 1})
        assert err.value.failure_type == JUDGE_UNAVAILABLE


async def test_bad_options_are_a_config_error(env: EquivalenceLLMJudgeEnvironment) -> None:
    for bad in [{"judge_prompt_template": "{nope}"}, {"response_extract_regex": "(("}, {"max_answer_chars": 0}]:
        with pytest.raises(VerifierError) as err:
            await score(env, task(), "Darwin", FakeJudge(EQUAL), {**JUDGE, **bad})
        assert err.value.failure_type == CONFIG_ERROR and next(iter(bad)) in str(err.value)


# ---- hostile answers --------------------------------------------------------------------------------


async def test_huge_answer_scores_zero_without_a_judge(env: EquivalenceLLMJudgeEnvironment) -> None:
    judge = FakeJudge()
    s = await score(env, task(), "x" * 2_000_000, judge)
    assert s.reward == 0.0 and s.details["failure_reason"].startswith("final_answer_too_long") and not judge.calls


async def test_nul_bytes_and_braces_reach_the_judge_verbatim(env: EquivalenceLLMJudgeEnvironment) -> None:
    answer = "Dar\x00win {question} {0} }{"
    judge = FakeJudge(EQUAL)
    s = await score(env, task(), answer, judge)
    assert s.reward == 1.0 and judge.calls[0][1][-1].content.endswith("CANDIDATE:\n" + answer)


async def test_backtracking_regex_on_hostile_answer_is_bounded(env: EquivalenceLLMJudgeEnvironment) -> None:
    row = task("a", template_metadata={"output_regex": r"(a|aa)+$"})
    judge = FakeJudge()
    start = time.monotonic()
    s = await score(env, row, "a" * 200 + "b", judge, {**JUDGE, "max_answer_chars": None})
    assert time.monotonic() - start < 10
    assert s.reward == 0.0 and s.details["failure_reason"] == "answer_extraction_timeout" and not judge.calls
