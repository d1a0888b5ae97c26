"""Multiple-choice QA (NeMo Gym 0.7.0's `mcqa`): the answer letter in the model's text vs `expected_answer`.

Rows load unchanged: `options` ([{"A": "text"}, ...]) and `expected_answer` are required; `grading_mode` picks
the extraction (`strict_single_letter_boxed`, the default; `lenient_boxed`; `lenient_answer_colon`), a row's
`template_metadata.output_regex` (one pattern or a list) is tried first, and the run's option `grading_mode`
overrides every row's, as NeMo Gym's server setting does (it alone may be `lenient_answer_colon_md`, which
also reads `template_metadata.answer_prefix`). Extraction: environments/mcqa_extract.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, Literal

import regex
from gymflow.environments import mcqa_extract as ex
from gymflow.environments.base import (
    JSON,
    Environment,
    EnvironmentOptions,
    TaskData,
    VerifyContext,
    episode_assistant_texts,
)
from pydantic import Field, field_validator, model_validator

from gymflow.kernel.errors import CONFIG_ERROR, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task

REGEX_TIMEOUT_S = 2.0  # per row pattern, over one answer; the run's `regex_timeout_s` option overrides it


GradingMode = Literal["strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon"]


class MCQAOptions(EnvironmentOptions):
    grading_mode: GradingMode | None = Field(None, description="Overrides every row's grading_mode")
    regex_timeout_s: float | None = Field(None, gt=0, le=60, description="One row pattern over one answer")


class MCQATask(TaskData):
    options: list[dict[str, str | None]]
    expected_answer: str
    grading_mode: GradingMode = "strict_single_letter_boxed"
    template_metadata: dict[str, Any] | None = None

    @field_validator("expected_answer")
    @classmethod
    def _one_letter(cls, v: str) -> str:
        gold = v.strip().upper()
        if len(gold) != 1 or not gold.isalpha():
            raise ValueError(f"expected a single option letter, got {v[:40]!r}")
        return gold

    @field_validator("template_metadata")
    @classmethod
    def _template(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return v
        prefix = v.get("answer_prefix")
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError("answer_prefix: expected a string")
        if "output_regex" in v:
            patterns = v["output_regex"]
            if isinstance(patterns, str):
                patterns = [patterns]
            if not isinstance(patterns, list) or not patterns or not all(isinstance(p, str) for p in patterns):
                raise ValueError("output_regex: expected a regex string or a non-empty list of them")
            for i, p in enumerate(patterns):
                try:
                    groups = ex.compile_row_regex(p).groups
                except regex.error as e:
                    raise ValueError(f"output_regex[{i}]: not a valid regex: {e}") from None
                if groups > 1:
                    raise ValueError(f"output_regex[{i}]: {groups} capture groups; at most 1 (the answer)")
        return v

    @model_validator(mode="after")
    def _gold_is_an_option(self) -> MCQATask:
        allowed = ex.allowed_letters(self.options)
        if allowed and self.expected_answer not in allowed:
            raise ValueError(f"expected_answer: {self.expected_answer!r} is not one of the options' letters "
                             f"({', '.join(sorted(allowed))})")
        if not allowed and not self.patterns:
            raise ValueError("options: no option has a one-letter key and a text; a row needs them unless "
                             "template_metadata.output_regex is given")
        return self

    @property
    def patterns(self) -> list[str]:
        raw = (self.template_metadata or {}).get("output_regex")
        return [] if raw is None else [raw] if isinstance(raw, str) else list(raw)


def grade(text: str, data: MCQATask, mode: str, timeout_s: float) -> str | None:
    """The extracted letter (None: no answer), as NeMo Gym's mcqa verify decides it."""
    allowed = ex.allowed_letters(data.options)
    letter = ex.custom_regex(text, data.patterns, data.options, allowed, timeout_s) if data.patterns else None
    if letter is not None:
        return letter
    if mode == "strict_single_letter_boxed":
        return ex.strict_boxed(text, allowed)
    if mode == "lenient_boxed":
        return ex.strict_boxed(text, allowed) or ex.boxed_option_text(text, data.options, allowed)
    if mode == "lenient_answer_colon":
        return ex.answer_colon(text, data.options, allowed)
    return ex.answer_colon_md(text, allowed, (data.template_metadata or {}).get("answer_prefix"))


def _options(ctx: VerifyContext) -> tuple[str | None, float]:
    mode, timeout = ctx.options.get("grading_mode"), ctx.options.get("regex_timeout_s", REGEX_TIMEOUT_S)
    if mode is not None and mode not in ex.ALL_MODES:
        raise VerifierError(f"environments.mcqa.grading_mode: {str(mode)[:100]!r} is not one of "
                            f"{', '.join(ex.ALL_MODES)}", failure_type=CONFIG_ERROR)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 60:
        raise VerifierError(f"environments.mcqa.regex_timeout_s: expected seconds in (0, 60], got {timeout!r}"[:200],
                            failure_type=CONFIG_ERROR)
    return mode, float(timeout)


class MCQAEnvironment(Environment[MCQATask]):
    name = "mcqa"
    task_type = MCQATask
    Options = MCQAOptions
    row_fields = ("uuid", "metadata", "reward_profiles", "extracted_answer")  # NeMo Gym provenance: not graded

    async def verify(self, data: MCQATask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        mode, timeout = _options(ctx)
        mode = mode or data.grading_mode
        text = "".join(episode_assistant_texts(messages)).strip()  # NeMo Gym reads the response's output_text
        # off the event loop: a long answer or a slow row regex must not stall the worker's other activities
        letter = await asyncio.to_thread(grade, text, data, mode, timeout) if text else None
        return Score(reward=1.0 if letter == data.expected_answer else 0.0,
                     details={"expected_answer": data.expected_answer, "extracted_answer": letter,
                              "grading_mode": mode})

    async def validate(self, task: Task) -> Score:
        data = self.parse_task(task)
        gold = ChatMessage(role="assistant", content=gold_answer(data))
        return await self.verify(data, (*task.messages, gold), {}, VerifyContext(""))

    def gold_turns(self, task: Task, data: MCQATask) -> Sequence[ChatMessage]:
        return (ChatMessage(role="assistant", content=gold_answer(data)),)


def gold_answer(data: MCQATask) -> str:
    """The gold letter written the first way the row reads it: boxed, `Answer: X`, or a row pattern filled in."""
    answers = [f"\\boxed{{{data.expected_answer}}}", f"Answer: {data.expected_answer}",
               *(_render(p, data.expected_answer) for p in data.patterns)]
    for answer in answers:
        if grade(answer, data, data.grading_mode, REGEX_TIMEOUT_S) == data.expected_answer:
            return answer
    return answers[0]


def _render(pattern: str, letter: str) -> str:
    """A plain pattern such as `Final Choice:\\s*([A-Za-z])` written out with the letter: `Final Choice: B`."""
    text = _GROUP.sub(letter, pattern, count=1)
    return _ESCAPE.sub(lambda m: "" if m.group(1) else m.group(2), _SPACE.sub(" ", text))


_GROUP = regex.compile(r"\((?!\?)[^()]*\)")
_SPACE = regex.compile(r"\\s[*+?]?")
_ESCAPE = regex.compile(r"(\\[bB]|[\^$])|\\(.)")
