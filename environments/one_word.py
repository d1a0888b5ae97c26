"""The one_word environment: answer with exactly one word from the row's list.

A format reward a very small model can learn within a few policy updates (examples/grpo_local.py):

- 1.0: the final reply is exactly one of `choices` (case, surrounding whitespace, quotes and punctuation
  ignored), e.g. `Yes.` for `["yes", "no"]`;
- 0.5: the reply is at most `near_words` words and one of them is a choice (`Yes, it is.`);
- 0.0: anything else, including no text at all.

With `answer` set, a reply that picks another choice scores half of what it would have.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from gymflow.environments.base import JSON, Environment, TaskData, VerifyContext, final_assistant_text
from pydantic import Field, field_validator, model_validator

from gymflow.kernel.wire import ChatMessage, Score, Task

MAX_CHOICES = 50
MAX_READ_CHARS = 4096  # a reply is scored on its start; a huge one is long-winded, not a better answer
_EDGE = " \t\r\n\"'`*_.,;:!?()[]{}<>«»“”‘’"
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).strip(_EDGE).casefold()


class OneWordTask(TaskData):
    choices: list[str] = Field(min_length=1, max_length=MAX_CHOICES)
    answer: str | None = None
    near_words: int = Field(5, ge=1, le=100)

    @field_validator("choices")
    @classmethod
    def _single_words(cls, v: list[str]) -> list[str]:
        seen: set[str] = set()
        for i, c in enumerate(v):
            word = normalise(c)
            if not word or _WORD.fullmatch(word) is None:
                raise ValueError(f"choices[{i}]: {c[:40]!r} is not a single word")
            if word in seen:
                raise ValueError(f"choices[{i}]: {c[:40]!r} repeats an earlier choice")
            seen.add(word)
        return v

    @model_validator(mode="after")
    def _answer_is_a_choice(self) -> OneWordTask:
        if self.answer is not None and normalise(self.answer) not in {normalise(c) for c in self.choices}:
            raise ValueError(f"answer: {self.answer[:40]!r} is not one of choices")
        return self


def score_reply(data: OneWordTask, reply: object) -> tuple[float, JSON]:
    """(reward, details) for a reply of any type (model output: None, huge, NUL bytes)."""
    if not isinstance(reply, str) or not reply.strip():
        return 0.0, {"reason": "no text"}
    text = normalise(reply[:MAX_READ_CHARS])
    choices = {normalise(c) for c in data.choices}
    if text in choices:
        base, picked, why = 1.0, text, "exactly one choice"
    else:
        words = _WORD.findall(text)
        picked = next((w for w in words if w in choices), None)
        if picked is None or len(words) > data.near_words:
            return 0.0, {"reason": "no choice" if picked is None else f"more than {data.near_words} words"}
        base, why = 0.5, f"a choice within {len(words)} words"
    wrong = data.answer is not None and picked != normalise(data.answer)
    return (base / 2 if wrong else base), {"reason": why, "picked": picked, "correct": not wrong}


class OneWordEnvironment(Environment[OneWordTask]):
    name = "one_word"
    task_type = OneWordTask
    placement = "local"  # a string comparison: runs inside the workflow pool

    async def verify(self, data: OneWordTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        reward, details = score_reply(data, final_assistant_text(messages))
        return Score(reward=reward, details=details)

    async def validate(self, task: Task) -> Score:
        data = self.parse_task(task)
        gold = ChatMessage(role="assistant", content=data.answer or data.choices[0])
        return await self.verify(data, (*task.messages, gold), {}, VerifyContext(""))

    def gold_turns(self, task: Task, data: OneWordTask) -> Sequence[ChatMessage]:
        return (ChatMessage(role="assistant", content=data.answer or data.choices[0]),)
