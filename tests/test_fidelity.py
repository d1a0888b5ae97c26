"""Agentic fidelity with NeMo Gym 0.7.0: answers are read across the episode (every assistant message after the
prompt, joined), `math_with_judge` asks the judge about the boxed answer only, and `reasoning_gym` falls back
to `\\boxed{}`. Built from NeMo Gym's recorded rows (tests/data/nemo_gym/README.md)."""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import reasoning_gym
from gymflow.environments.base import VerifyContext
from gymflow.environments.math_with_judge import MathWithJudgeEnvironment, judge_messages, last_boxed
from gymflow.environments.reasoning_gym_env import ReasoningGymEnvironment, extract_final_answer, first_boxed

from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.kernel.responses_format import input_to_messages
from gymflow.kernel.wire import ChatMessage, Task
from tests.conftest import SHARED

FIXTURES = Path(__file__).parent / "data" / "nemo_gym"
AGENT_ROWS = [json.loads(line) for line in
              (FIXTURES / "math_with_judge" / "example_rollouts_terminus_2.jsonl").read_text().splitlines()]
QUESTIONS = {json.loads(line)["expected_answer"]: json.loads(line)["question"]
             for line in (SHARED / "math_with_judge" / "example.jsonl").read_text().splitlines() if line.strip()}
NO_JUDGE = {"should_use_judge": False}
DIFFERENT = "My final verdict is different [[A!=B]]"


@pytest.fixture(scope="module")
def math_env() -> Iterator[MathWithJudgeEnvironment]:
    # verify called directly runs math-verify in this process, unbounded: row 0's answer is a (2+sqrt 3)^2016
    # closed form, seconds of SymPy on a loaded box.
    yield MathWithJudgeEnvironment(judge_backoff_s=0)


class FakeJudge:
    def __init__(self, *replies: str) -> None:
        self.replies, self.calls = list(replies), []  # type: ignore[var-annotated]

    async def __call__(self, model: str, messages: Sequence[ChatMessage]) -> str:
        self.calls.append(list(messages))
        return self.replies.pop(0)


def agent_episode(row: dict[str, Any]) -> tuple[Task, list[ChatMessage]]:
    """The rollout as a task (its question from example.jsonl: rollout rows drop it) and its transcript."""
    task = row_to_task({**row, "question": QUESTIONS[row["expected_answer"]]}, env="math_with_judge", default_id="r")
    return task, [*task.messages, *input_to_messages(row["response"]["output"], "response.output")]


def unbox(text: str) -> str:
    """`\\boxed{X}` -> `X`, for every box in the text."""
    while (inner := last_boxed(text)) is not None:
        text = text.replace("\\boxed{" + inner + "}", inner)
    return text


def unbox_final(messages: list[ChatMessage], everywhere: bool = False) -> list[ChatMessage]:
    last = max(i for i, m in enumerate(messages) if m.role == "assistant" and m.content)
    return [m.model_copy(update={"content": unbox(m.content)})
            if m.role == "assistant" and m.content and (everywhere or i == last) else m
            for i, m in enumerate(messages)]


async def score(env: MathWithJudgeEnvironment, task: Task, messages: Sequence[ChatMessage], judge: Any = None,
                options: dict[str, Any] | None = None):
    return await env.verify(env.parse_task(task), messages, {}, VerifyContext("policy", judge, options or NO_JUDGE))


# ---- math_with_judge -------------------------------------------------------------------------------------


async def test_agent_rollouts_score_as_recorded(math_env: MathWithJudgeEnvironment) -> None:
    rewards, extracted = [], []
    for row in AGENT_ROWS:
        task, messages = agent_episode(row)
        s = await score(math_env, task, messages)
        rewards.append(s.reward)
        extracted.append(s.details["extracted_answer"])
    assert rewards == [r["reward"] for r in AGENT_ROWS]
    assert extracted == [r["extracted_answer"] for r in AGENT_ROWS]  # math-verify read the same text NeMo Gym did


async def test_box_removed_from_the_final_message_still_scores_as_nemo_gym(math_env: MathWithJudgeEnvironment) -> None:
    """The issue's case: the agent boxed its answer in an earlier turn and only confirms it at the end.
    Reading the final message alone scored these 0,0,0,0,0; NeMo Gym reads the episode and scores 1,0,1,1,1."""
    rewards = []
    for row in AGENT_ROWS:
        task, messages = agent_episode(row)
        messages = unbox_final(messages)
        finals = [m.content for m in messages if m.role == "assistant" and m.content]
        assert "\\boxed" not in finals[-1] and any("\\boxed" in t for t in finals[:-1])
        rewards.append((await score(math_env, task, messages)).reward)
    assert rewards == [r["reward"] for r in AGENT_ROWS]
    assert 0 < sum(rewards) < len(rewards)  # both outcomes are exercised


async def test_judge_gets_only_the_boxed_answer(math_env: MathWithJudgeEnvironment) -> None:
    row = next(r for r in AGENT_ROWS if r["reward"] == 0)
    task, messages = agent_episode(row)
    judge = FakeJudge(DIFFERENT)
    s = await score(math_env, task, unbox_final(messages), judge, {"judge_model": "judge"})
    assert s.reward == 0.0 and len(judge.calls) == 1
    # NeMo Gym 0.7.0 sends the boxed answer (its recorded extracted answer here), not the agent's text
    assert judge.calls[0] == judge_messages(task.data["question"], row["expected_answer"], row["extracted_answer"])


async def test_no_box_anywhere_scores_zero_without_library_or_judge(math_env: MathWithJudgeEnvironment) -> None:
    row = next(r for r in AGENT_ROWS if r["reward"] == 1)
    task, messages = agent_episode(row)
    judge = FakeJudge()
    s = await score(math_env, task, unbox_final(messages, everywhere=True), judge, {"judge_model": "judge"})
    assert s.reward == 0.0 and not judge.calls
    assert s.details["boxed_answer"] is None and s.details["extracted_answer"] is None


async def test_assistant_turns_in_the_prompt_are_not_the_models(math_env: MathWithJudgeEnvironment) -> None:
    """A few-shot prompt's assistant turn is input, not the model's output (NeMo Gym reads `response.output`)."""
    expected = next(iter(QUESTIONS))
    task = Task(id="fs", env="math_with_judge", data={"question": QUESTIONS[expected], "expected_answer": expected},
                messages=(ChatMessage(role="user", content="Example: 1+1?"),
                          ChatMessage(role="assistant", content=f"\\boxed{{{expected}}}"),
                          ChatMessage(role="user", content=QUESTIONS[expected])))
    assert (await score(math_env, task, [*task.messages, ChatMessage(role="assistant", content="I'm not sure.")])
            ).reward == 0.0
    answered = [*task.messages, ChatMessage(role="assistant", content=f"\\boxed{{{expected}}}"),
                ChatMessage(role="assistant", content="Done.")]
    assert (await score(math_env, task, answered)).reward == 1.0


# ---- reasoning_gym ---------------------------------------------------------------------------------------

RG = ReasoningGymEnvironment()


def rg_rows() -> list[Task]:
    tasks, errors = load_jsonl(FIXTURES / "reasoning_gym" / "example.jsonl", env="reasoning_gym")
    assert not errors and tasks
    return tasks


async def rg_score(task: Task, *replies: str) -> float:
    messages = [*task.messages, *(ChatMessage(role="assistant", content=r) for r in replies)]
    return (await RG.verify(RG.parse_task(task), messages, {}, VerifyContext(""))).reward


async def test_boxed_fallback_scores_the_gold_one() -> None:
    for task in rg_rows():
        gold = task.data["answer"]
        reply = f"Final answer: \\boxed{{{gold}}}"
        scorer = reasoning_gym.get_score_answer_fn(task.data["metadata"]["source_dataset"])
        whole_text = scorer(answer=reply, entry=task.data)  # what scoring the whole reply gave before the fallback
        assert whole_text < 1.0
        assert await rg_score(task, reply) == 1.0, task.id


async def test_answer_found_across_the_episode() -> None:
    task = rg_rows()[0]
    gold = task.data["answer"]
    assert await rg_score(task, f"Reasoning done. <answer>{gold}</answer>", "That is my final answer.") == 1.0
    assert await rg_score(task, f"\\boxed{{{gold}}}", "Confirmed.") == 1.0
    assert await rg_score(task, "<think>maybe <answer>" + gold + "</answer></think>I don't know.") < 1.0


@pytest.mark.parametrize(("texts", "answer"), [
    (["<answer>a</answer>", "\\boxed{b}"], "a"),  # the tag wins over a box
    (["\\boxed{ a }", "then \\boxed{b}"], "a"),  # NeMo Gym's regex takes the first box
    (["<answer>a</answer>", "<answer>b</answer>"], "b"),  # and the last tag
    (["\\boxed{\\frac{1}{2}}"], "\\frac{1"),  # no nested braces, as NeMo Gym's `[^}]+`
    (["<think>\\boxed{x}</think>y"], "y"),  # reasoning is not the answer
    (["part <ans", "wer>7</answer>"], "7"),  # joined with no separator, as NeMo Gym joins
])
def test_answer_rule(texts: list[str], answer: str) -> None:
    assert extract_final_answer(texts) == answer


def test_first_boxed_matches_nemo_gyms_regex_in_linear_time() -> None:
    nemo = re.compile(r"\\boxed\{([^}]+)\}")  # NeMo Gym 0.7.0's fallback pattern
    rng = random.Random(7)
    for _ in range(2000):
        text = "".join(rng.choice(["\\boxed{", "}", "{", "a", " ", "\\boxed"]) for _ in range(rng.randint(0, 12)))
        found = nemo.search(text)
        assert first_boxed(text) == (found.group(1) if found else None), text
    hostile = "\\boxed{" * 50_000 + "\x00" + "<answer>" * 50_000  # minutes for the regexes
    started = time.monotonic()
    assert extract_final_answer([hostile, "done"]) == hostile.strip() + "done"
    assert time.monotonic() - started < 5
