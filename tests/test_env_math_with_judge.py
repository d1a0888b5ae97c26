"""math_with_judge: boxed extraction, math-verify (in a supervised process on workers), the two-order judge,
masking on judge failure and on a check past its limits, `validate` on the example tasks, and a replay of NeMo
Gym's recorded rollouts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import math_verify
import pytest
import pytest_asyncio
from gymflow.activities.env_activities import verify_episode
from gymflow.activities.env_processes import EnvProcesses
from gymflow.environments.base import VerifyContext
from gymflow.environments.math_with_judge import (
    JUDGE_FAILED,
    JUDGE_UNAVAILABLE,
    MathWithJudgeEnvironment,
    judge_messages,
    judge_verdict,
    last_boxed,
    library_check,
)

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.errors import GymflowError, VerifierError
from gymflow.kernel.failures import VERIFIER_FAILED, VERIFIER_TIMEOUT
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, Task
from tests.conftest import SHARED
from tests.helpers import FakeJudge

DATA = SHARED / "math_with_judge"
ROLLOUTS = [json.loads(line) for line in (DATA / "example_rollouts.jsonl").read_text().splitlines() if line.strip()]
EQUAL, DIFFERENT = "My final verdict is equivalent [[A=B]]", "My final verdict is different [[A!=B]]"
JUDGE = {"judge_model": "judge"}


@pytest.fixture(scope="module")
def env() -> MathWithJudgeEnvironment:
    # verify called directly runs math-verify in this process, unbounded (replay row 1's true answer needs 4-9 s of
    # SymPy on a loaded 2-core box); the supervised path and its limits are tested below.
    return MathWithJudgeEnvironment(judge_backoff_s=0)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def procs() -> AsyncIterator[EnvProcesses]:
    pool = EnvProcesses(2)
    pool.start()
    yield pool
    await pool.close()


def math_task(expected: str = "4", question: str = "What is 2+2?", **data: Any) -> Task:
    return Task(id="m0", env="math_with_judge", messages=(ChatMessage(role="user", content=question),),
                data={"question": question, "expected_answer": expected, **data})


async def score(env: MathWithJudgeEnvironment, task: Task, answer: str | None, judge: FakeJudge | None = None,
                options: dict[str, Any] | None = None):
    transcript = (*task.messages, ChatMessage(role="assistant", content=answer))
    return await env.verify(env.parse_task(task), transcript, {}, VerifyContext("policy", judge, options or {}))


# ---- pure helpers --------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "boxed"), [
    (r"so \boxed{4}.", "4"),
    (r"\boxed{1} then, on reflection, \boxed{2}", "2"),
    (r"\boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
    (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
    (r"\boxed{\boxed{3}}", r"\boxed{3}"),
    (r"\boxed {7}", "7"),
    (r"\boxed{1} and a truncated \boxed{\frac{2}{", "1"),
    ("The answer is 4", None),
    ("", None),
])
def test_last_boxed(text: str, boxed: str | None) -> None:
    assert last_boxed(text) == boxed


@pytest.mark.parametrize(("reply", "verdict"), [
    (EQUAL, "equal"), (DIFFERENT, "different"), ("no idea", "no_label"),
    ("[[A=B]] ... or rather [[A!=B]]", "equal"), ("[[A!=B]], not [[A=B]]", "different"),
])
def test_judge_verdict_first_label_wins(reply: str, verdict: str) -> None:
    assert judge_verdict(reply) == verdict


# ---- library check -------------------------------------------------------------------------------


async def test_right_answer(env: MathWithJudgeEnvironment) -> None:
    s = await score(env, math_task("4"), r"2+2 is \boxed{4}")
    assert (s.reward, s.masked) == (1.0, False)
    assert s.details["extracted_answer"] == "4" and s.details["library_reward"] == 1.0
    assert s.details["judge_evaluations"] is None


async def test_wrong_answer_without_judge(env: MathWithJudgeEnvironment) -> None:
    s = await score(env, math_task("4"), r"\boxed{5}")
    assert s.reward == 0.0 and s.details["extracted_answer"] == "5" and s.details["judge_evaluations"] is None


async def test_malformed_answer_without_boxed(env: MathWithJudgeEnvironment) -> None:
    s = await score(env, math_task("4"), "The answer is 4")
    assert s.reward == 0.0 and s.details["boxed_answer"] is None and s.details["extracted_answer"] is None


@pytest.mark.parametrize("answer", ["", "   ", None])
async def test_empty_answer_scores_zero_without_asking_the_judge(env: MathWithJudgeEnvironment,
                                                                 answer: str | None) -> None:
    judge = FakeJudge()
    s = await score(env, math_task("4"), answer, judge, JUDGE)
    assert s.reward == 0.0 and not judge.calls


async def test_nested_braces(env: MathWithJudgeEnvironment) -> None:
    s = await score(env, math_task(r"\(\frac{\sqrt{2}}{2}\)"), r"\boxed{\frac{1}{\sqrt{2}}}")
    assert s.reward == 1.0 and s.details["boxed_answer"] == r"\frac{1}{\sqrt{2}}"


# True answers that take SymPy ~75 ms each; a distinct one per check, since SymPy caches within a process.
HEAVY = {8: (18817, 10864), 9: (70226, 40545), 10: (262087, 151316), 11: (978122, 564719)}


def heavy(n: int) -> tuple[str, str]:
    """(expected, answer) for (2+sqrt 3)^n, the answer in expanded form."""
    a, b = HEAVY[n]
    return rf"(2+\sqrt{{3}})^{{{n}}}", rf"\boxed{{{a} + {b}\sqrt{{3}}}}"


async def _supervised(procs: EnvProcesses, answer: str, options: dict[str, Any], judge: FakeJudge | None = None,
                      expected: str = "4"):
    """Verify as a worker runs it: in a supervised process, or (with a judge) in the loop with math-verify in one."""
    env = MathWithJudgeEnvironment(judge_backoff_s=0)
    task = math_task(expected)
    transcript = (*task.messages, ChatMessage(role="assistant", content=answer))
    return await verify_episode(env, None, transcript, {}, VerifyContext("policy", judge, options), task, procs)


async def test_the_check_runs_in_a_supervised_process(procs: EnvProcesses) -> None:
    s = await _supervised(procs, r"so \boxed{0.5}", {"should_use_judge": False}, expected=r"\(\frac{1}{2}\)")
    assert s.reward == 1.0 and s.details["extracted_answer"] == "1/2"
    s = await _supervised(procs, r"\boxed{5}", {"should_use_judge": False})
    assert s.reward == 0.0 and not s.masked


@pytest.mark.parametrize("judged", [False, True])
async def test_a_check_past_its_time_limit_masks_instead_of_scoring_zero(procs: EnvProcesses, judged: bool) -> None:
    # NeMo Gym scores a timed-out check 0; under load a true answer timed out. This true answer takes ~75 ms of
    # SymPy; 5 ms (counted from when a process, math-verify already imported, takes the check) is too short.
    limit = {"verify_timeout_s": 0.005}
    options = {**JUDGE, **limit} if judged else {"should_use_judge": False, **limit}
    judge = FakeJudge(EQUAL, EQUAL) if judged else None
    expected, answer = heavy(9 if judged else 10)
    s = await _supervised(procs, answer, options, judge, expected=expected)
    assert s.masked and s.reward is None and s.failure_type == VERIFIER_TIMEOUT, s
    assert "exceeded its 0.005 s limit" in s.details["error"]
    generous = await _supervised(procs, answer, {**options, "verify_timeout_s": 30}, judge, expected=expected)
    assert generous.reward == 1.0, "the same check, with time: a true answer"
    if judge is not None:
        assert not judge.calls, "a check that could not finish asks no judge"


async def test_library_timeout_s_is_still_the_verify_limit(procs: EnvProcesses) -> None:
    expected, answer = heavy(11)
    s = await _supervised(procs, answer, {"should_use_judge": False, "library_timeout_s": 0.005}, expected=expected)
    assert s.failure_type == VERIFIER_TIMEOUT


async def test_an_io_failure_inside_the_check_masks_instead_of_scoring_zero(monkeypatch) -> None:
    # The platform's failure, not the answer's: unscorable, never reward 0.
    def broken(*_: object, **__: object) -> None:
        raise OSError("[Errno 24] Too many open files")

    monkeypatch.setattr(math_verify, "parse", broken)
    with pytest.raises(VerifierError, match="could not run") as err:
        library_check("2", r"\boxed{2}")
    assert err.value.failure_type == VERIFIER_FAILED


async def test_an_answer_that_makes_math_verify_raise_scores_zero(monkeypatch) -> None:
    # math-verify raising over the answer is the answer's fault: 0, as in NeMo Gym.
    def raising(*_: object, **__: object) -> None:
        raise ValueError("bad latex")

    monkeypatch.setattr(math_verify, "parse", raising)
    assert library_check("2", r"\boxed{2}") == (0.0, None)


async def test_judge_equal_in_both_orders_scores_one(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(EQUAL, EQUAL)
    s = await score(env, math_task("4", "What is 2+2?"), r"It is \boxed{four}.", judge, JUDGE)
    assert s.reward == 1.0 and s.details["library_reward"] == 0.0
    assert [c[0] for c in judge.calls] == ["judge", "judge"]
    # NeMo Gym 0.7.0 sends the judge the boxed answer only, not the text around it
    assert judge.calls[0][1] == judge_messages("What is 2+2?", "4", "four")
    assert judge.calls[1][1] == judge_messages("What is 2+2?", "four", "4")
    assert [e["verdict"] for e in s.details["judge_evaluations"]] == ["equal", "equal"]


async def test_judge_disagreeing_on_swap_scores_zero(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(EQUAL, DIFFERENT)
    s = await score(env, math_task("4"), r"\boxed{four}", judge, JUDGE)
    assert s.reward == 0.0 and len(judge.calls) == 2


async def test_judge_saying_different_first_is_not_asked_again(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(DIFFERENT)
    s = await score(env, math_task("4"), r"\boxed{5}", judge, JUDGE)
    assert s.reward == 0.0 and len(judge.calls) == 1


async def test_judge_without_label_counts_as_different(env: MathWithJudgeEnvironment) -> None:
    s = await score(env, math_task("4"), r"\boxed{5}", FakeJudge("I cannot tell."), JUDGE)
    assert s.reward == 0.0 and s.details["judge_evaluations"][0]["verdict"] == "no_label"


async def test_judge_not_asked_when_library_passes(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge()
    assert (await score(env, math_task("4"), r"\boxed{4}", judge, JUDGE)).reward == 1.0 and not judge.calls


async def test_judge_model_can_come_from_the_task(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(EQUAL, EQUAL)
    s = await score(env, math_task("4", judge_model="task-judge"), r"\boxed{four}", judge)
    assert s.reward == 1.0 and judge.calls[0][0] == "task-judge"


async def test_judge_switched_off_by_option(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge()
    s = await score(env, math_task("4"), r"\boxed{four}", judge, {**JUDGE, "should_use_judge": False})
    assert s.reward == 0.0 and not judge.calls


async def test_judge_that_keeps_failing_masks_the_rollout(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(*[ConnectionError("judge down")] * env.judge_attempts)
    with pytest.raises(VerifierError) as err:
        await score(env, math_task("4"), r"\boxed{four}", judge, JUDGE)
    assert err.value.failure_type == JUDGE_FAILED and len(judge.calls) == env.judge_attempts


async def test_judge_failure_is_retried(env: MathWithJudgeEnvironment) -> None:
    judge = FakeJudge(ConnectionError("blip"), EQUAL, EQUAL)
    assert (await score(env, math_task("4"), r"\boxed{four}", judge, JUDGE)).reward == 1.0


def non_retryable(message: str) -> Exception:
    err = RuntimeError(message)
    err.non_retryable = True  # type: ignore[attr-defined]  # what Temporal's ApplicationError carries
    return err


@pytest.mark.parametrize("bad", [non_retryable("401"), GymflowError("recording exhausted")])
async def test_deterministic_judge_error_is_not_retried(env: MathWithJudgeEnvironment, bad: Exception) -> None:
    judge = FakeJudge(bad)
    with pytest.raises(VerifierError):
        await score(env, math_task("4"), r"\boxed{four}", judge, JUDGE)
    assert len(judge.calls) == 1


async def test_judge_requested_but_unavailable_is_unscorable(env: MathWithJudgeEnvironment) -> None:
    with pytest.raises(VerifierError) as err:
        await score(env, math_task("4"), r"\boxed{four}", None, {"should_use_judge": True, "judge_model": "j"})
    assert err.value.failure_type == JUDGE_UNAVAILABLE


# ---- the example data ----------------------------------------------------------------------------


async def test_validate_passes_on_every_example_task(env: MathWithJudgeEnvironment) -> None:
    tasks, errors = load_jsonl(DATA / "example.jsonl", env="math_with_judge")
    assert not errors and len(tasks) == 5
    for task in tasks:
        s = await env.validate(task)
        assert s.reward == 1.0, (task.data["expected_answer"], s.details)


def recorded_judge(row: dict[str, Any]) -> FakeJudge:
    """Replays the row's judge replies, checking each prompt is the one NeMo Gym 0.7.0 sends. The recording is
    older: its prompts hold the whole answer, `\\boxed{X}`, where 0.7.0 sends X."""
    evaluations = row["judge_evaluations"] or []
    replies = [e["response"]["output"][-1]["content"][-1]["text"] for e in evaluations]
    judge = FakeJudge(*replies)
    answer = "".join(c["text"] for o in row["response"]["output"] if o["type"] == "message" for c in o["content"])
    boxed = last_boxed(answer)
    assert boxed is not None and all(answer in e["responses_create_params"]["input"][1]["content"] for e in evaluations)
    judge.expected = [[(m["role"], m["content"].replace(answer, boxed))  # type: ignore[attr-defined]
                       for m in e["responses_create_params"]["input"]] for e in evaluations]
    return judge


def rollout_task(row: dict[str, Any], i: int) -> Task:
    """The rollout rows dropped `question` (the judge prompts show it was sent): take it from example.jsonl."""
    examples = [json.loads(line) for line in (DATA / "example.jsonl").read_text().splitlines() if line.strip()]
    prompt = row["responses_create_params"]["input"][0]["content"]
    question = next(e["question"] for e in examples if e["responses_create_params"]["input"][0]["content"] == prompt)
    return row_to_task({**row, "question": question}, env="math_with_judge", default_id=f"rollout-{i}")


@pytest.mark.parametrize("i", range(len(ROLLOUTS)))
async def test_replay_matches_nemo_gym_reward(env: MathWithJudgeEnvironment, i: int) -> None:
    row = ROLLOUTS[i]
    task = rollout_task(row, i)
    transcript = (*task.messages, *input_to_messages(row["response"]["output"], "response.output"))
    judge = recorded_judge(row)
    s = await env.verify(env.parse_task(task), transcript, {}, VerifyContext("policy", judge, JUDGE))
    assert s.reward == row["reward"]
    assert s.details["library_reward"] == row["library_reward"]
    assert s.details["extracted_answer"] == row["extracted_answer"]
    assert [[(m.role, m.content) for m in msgs] for _, msgs in judge.calls] == judge.expected  # type: ignore[attr-defined]
