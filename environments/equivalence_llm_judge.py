"""Answer equivalence by an LLM judge (NeMo Gym's `equivalence_llm_judge` resources server).

The judge compares the final answer with `expected_answer` and must print one of two labels; the reward
is 1 when its verdict is "equal". Row format: NeMo Gym's, unchanged (`expected_answer`, or
`metadata.expected_answer`; optional `template_metadata.output_regex` per row).

As NeMo Gym does it:
- the question is the last user message (optionally cut by `question_extract_regex`); the answer is the
  last assistant text, stripped; an empty answer scores 0 without a judge call;
- an extraction regex (the row's `template_metadata.output_regex`, else `response_extract_regex`) takes
  its last match, first non-empty group; no match means the whole answer is judged;
- the *last* label in the judge's reply is its verdict (labels never overlap: `INCORRECT` is not also
  `CORRECT`); no label means "different";
- `check_twice_swap`: after an "equal", ask again with gold and answer swapped (positional bias);
  `reward_if_swap_fails` when the second verdict is not "equal";
- `check_full_generation_on_fail` (rows with a per-row regex only): after a "different", judge the
  whole answer; `reward_if_full_generation_succeeds` when that is "equal";
- `extraction_length_threshold`: a gold answer longer than this skips the per-row regex and the second pass.
Differences: the judge being unreachable masks the rollout (VerifierError), never scores 0; an answer
over `max_answer_chars` (default 100,000, NeMo Gym: no limit) scores 0 without a judge call; a row
regex that does not compile is a `bad_task` at load time (NeMo Gym ignores it); a regex that runs past
its time budget on the model's text scores 0 (`failure_reason: answer_extraction_timeout`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import regex
from gymflow.environments.base import ChatFn, Environment, EnvironmentOptions, TaskData, VerifyContext
from gymflow.environments.equivalence_llm_judge_prompt import DEFAULT_PROMPT_TEMPLATE
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gymflow.kernel.errors import CONFIG_ERROR, GymflowError, VerifierError
from gymflow.kernel.failures import JUDGE_FAILED, JUDGE_UNAVAILABLE
from gymflow.kernel.wire import ChatMessage, Score, Task

JSON = dict[str, Any]

_REGEX_TIMEOUT_S = 1.0  # per search over the model's text: a dataset regex may backtrack badly on hostile output
_TAIL = 400  # characters of each judge reply and of the judged answer kept in details (workflow history)


def compile_regex(pattern: str) -> regex.Pattern[str]:
    """NeMo Gym's flags (MULTILINE | DOTALL); raises ValueError naming the problem."""
    try:
        return regex.compile(pattern, regex.MULTILINE | regex.DOTALL)
    except (regex.error, TypeError) as e:
        raise ValueError(f"invalid regular expression: {e}") from None


def extract(text: str, pattern: str | None) -> str:
    """The last match's first non-empty group (else the whole match), stripped; no match: `text` itself.

    Raises TimeoutError when the search runs past its budget."""
    if not pattern:
        return text
    last = None
    for m in compile_regex(pattern).finditer(text, timeout=_REGEX_TIMEOUT_S):
        last = m
    if last is None:
        return text
    for group in last.groups():
        if isinstance(group, str) and group.strip():
            return group.strip()
    return last.group(0).strip()


def parse_verdict(text: str, equal_label: str, not_equal_label: str) -> tuple[str | None, list[str]]:
    """(the last label in `text`, parsing issues). Matches never overlap; at one position the longer label wins."""
    labels = sorted({equal_label, not_equal_label}, key=len, reverse=True)
    found = [m.group(0) for m in regex.finditer("|".join(regex.escape(label) for label in labels), text)]
    issues = []
    if not found:
        issues.append("no_verdict")
    else:
        if equal_label in found and not_equal_label in found:
            issues.append("conflicting_verdicts")
        if len(found) > len(set(found)):
            issues.append("repeated_verdict")
    return (found[-1] if found else None), issues


class TemplateMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")
    output_regex: str | None = None

    @field_validator("output_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v:
            compile_regex(v)
        return v


class EquivalenceLLMJudgeTask(TaskData):
    expected_answer: str | None = None
    metadata: dict[str, Any] | None = None  # NeMo Gym reads metadata.expected_answer when the top level has none
    template_metadata: TemplateMetadata | None = None

    @model_validator(mode="after")
    def _has_gold(self) -> EquivalenceLLMJudgeTask:
        if self.gold is None:
            raise ValueError("expected_answer: required (or metadata.expected_answer), a non-empty string")
        return self

    @property
    def gold(self) -> str | None:
        if self.expected_answer:
            return self.expected_answer
        value = (self.metadata or {}).get("expected_answer")
        return None if value is None or value == "" else str(value)

    @property
    def row_regex(self) -> str | None:
        return self.template_metadata.output_regex if self.template_metadata else None


class JudgeOptions(BaseModel):
    """The run's options for this environment (`environments.equivalence_llm_judge` in the config); NeMo Gym's
    names and the defaults of its shipped `equivalence_llm_judge.yaml`."""

    model_config = ConfigDict(extra="forbid")
    judge_model: str | None = None
    judge_system_message: str | None = None
    judge_prompt_template: str = DEFAULT_PROMPT_TEMPLATE
    judge_equal_label: str = Field("[[A=B]]", min_length=1)
    judge_not_equal_label: str = Field("[[A!=B]]", min_length=1)
    question_extract_regex: str | None = None
    response_extract_regex: str | None = None
    msg_extraction_failure: str = "[NO VALID ANSWER EXTRACTED]"
    max_answer_chars: int | None = Field(100_000, gt=0)
    check_twice_swap: bool = False
    reward_if_swap_fails: float = 0.0
    use_per_record_regex: bool = True
    extraction_length_threshold: int | None = None
    check_full_generation_on_fail: bool = False
    reward_if_full_generation_succeeds: float = 0.0
    judge_attempts: int = Field(3, ge=1, le=10)
    judge_timeout_s: float = Field(300.0, gt=0)

    @field_validator("question_extract_regex", "response_extract_regex")
    @classmethod
    def _compiles(cls, v: str | None) -> str | None:
        if v:
            compile_regex(v)
        return v

    @field_validator("judge_prompt_template")
    @classmethod
    def _placeholders(cls, v: str) -> str:
        try:
            v.format(question="", expected_answer="", generated_answer="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"placeholders are {{question}}, {{expected_answer}}, {{generated_answer}}: {e!r}"
                             ) from None
        return v


class EquivalenceOptions(JudgeOptions, EnvironmentOptions):
    """The judge's options beside the platform's (placement, limits)."""


def load_options(options: JSON) -> JudgeOptions:
    known = {k: v for k, v in options.items() if k in JudgeOptions.model_fields}
    try:
        return JudgeOptions.model_validate(known)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise VerifierError(f"equivalence_llm_judge option {where}: {first['msg']}",
                            failure_type=CONFIG_ERROR) from None


def last_text(messages: Sequence[ChatMessage], role: str) -> str:
    """The last non-empty text of `role`, stripped (NeMo Gym skips tool-call items, which carry no text)."""
    for m in reversed(messages):
        if m.role == role and m.text and m.text.strip():  # a message with an image: its text parts
            return m.text.strip()
    return ""


class EquivalenceLLMJudgeEnvironment(Environment[EquivalenceLLMJudgeTask]):
    """Options: see `JudgeOptions`. Without a judge (`judge_model` and `ctx.chat`) nothing can be scored: masked."""

    name = "equivalence_llm_judge"
    task_type = EquivalenceLLMJudgeTask
    Options = EquivalenceOptions
    needs = ("a judge model (environments.equivalence_llm_judge.judge_model)",)
    in_loop_reason = "its verdict is a judge model's (async `ctx.chat`); its regexes run with a timeout (`regex`)"
    row_fields = ("question", "uuid", "options", "reward_profiles", "judge_evaluations")  # NeMo Gym: unread here

    def __init__(self, *, judge_backoff_s: float = 1.0) -> None:
        self.judge_backoff_s = judge_backoff_s

    async def verify(self, data: EquivalenceLLMJudgeTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        opts = load_options(ctx.options)
        gold = data.gold or ""
        answer = last_text(messages, "assistant")
        details: JSON = {"expected_answer": gold, "judge_evaluations": []}
        if not answer:
            return Score(reward=0.0, details={**details, "failure_reason": "empty_final_answer"})
        if opts.max_answer_chars is not None and len(answer) > opts.max_answer_chars:
            reason = f"final_answer_too_long: {len(answer)} characters exceeds {opts.max_answer_chars}"
            return Score(reward=0.0, details={**details, "failure_reason": reason})
        if not opts.judge_model or ctx.chat is None:
            raise VerifierError("equivalence_llm_judge needs a judge: set its judge_model option and configure that "
                                "model", failure_type=JUDGE_UNAVAILABLE)
        try:
            question = extract(last_text(messages, "user"), opts.question_extract_regex)
            generated = extract(answer, self._answer_regex(data, opts, gold))
        except TimeoutError:
            return Score(reward=0.0, details={**details, "failure_reason": "answer_extraction_timeout"})
        judge = _Judge(ctx.chat, opts, question, self.judge_backoff_s)
        details["extracted_answer"] = generated[-_TAIL:]
        reward = await self._score(judge, data, opts, gold, answer, generated)
        return Score(reward=reward, details={**details, "judge_model": opts.judge_model,
                                             "judge_evaluations": judge.evaluations})

    async def validate(self, task: Task) -> Score:
        """The gold as the answer, with an exact-match stand-in for the judge: the row parses, the prompt renders
        and the extraction keeps the gold intact."""
        data = self.parse_task(task)
        gold_message = ChatMessage(role="assistant", content=data.gold)

        async def exact(model: str, msgs: Sequence[ChatMessage]) -> str:
            prompt = msgs[-1].text or ""
            ok = prompt.endswith(f"\n{(data.gold or '').strip()}")
            return "[[A=B]]" if ok else "[[A!=B]]"

        ctx = VerifyContext("", chat=exact, options={"judge_model": "gold-exact-match"})
        return await self.verify(data, (*task.messages, gold_message), {}, ctx)

    @staticmethod
    def _answer_regex(data: EquivalenceLLMJudgeTask, opts: JudgeOptions, gold: str) -> str | None:
        row = data.row_regex if opts.use_per_record_regex else None
        if row and opts.extraction_length_threshold is not None and len(gold) > opts.extraction_length_threshold:
            return None  # a long gold: judge the whole answer
        return row or opts.response_extract_regex

    @staticmethod
    def _long_gold_with_row_regex(data: EquivalenceLLMJudgeTask, opts: JudgeOptions, gold: str) -> bool:
        return bool(opts.use_per_record_regex and data.row_regex and opts.extraction_length_threshold is not None
                    and len(gold) > opts.extraction_length_threshold)

    async def _score(self, judge: _Judge, data: EquivalenceLLMJudgeTask, opts: JudgeOptions, gold: str,
                     answer: str, generated: str) -> float:
        skip_second = self._long_gold_with_row_regex(data, opts, gold)
        if await judge.ask("first", gold, generated):
            if not opts.check_twice_swap or skip_second:
                return 1.0
            return 1.0 if await judge.ask("swapped", generated, gold) else opts.reward_if_swap_fails
        if skip_second or not (opts.check_full_generation_on_fail and opts.use_per_record_regex and data.row_regex):
            return 0.0
        rescued = await judge.ask("full_generation", gold, answer or opts.msg_extraction_failure)
        return opts.reward_if_full_generation_succeeds if rescued else 0.0


class _Judge:
    """Asks the judge and records each evaluation."""

    def __init__(self, chat: ChatFn, opts: JudgeOptions, question: str, backoff_s: float) -> None:
        self.chat, self.opts, self.question, self.backoff_s = chat, opts, question, backoff_s
        self.evaluations: list[JSON] = []

    def messages(self, expected: str, generated: str) -> list[ChatMessage]:
        prompt = self.opts.judge_prompt_template.format(question=self.question, expected_answer=expected,
                                                        generated_answer=generated)
        system = self.opts.judge_system_message
        head = [ChatMessage(role="system", content=system)] if system else []
        return [*head, ChatMessage(role="user", content=prompt)]

    async def ask(self, kind: str, expected: str, generated: str) -> bool:
        """True when the judge's verdict is "equal"."""
        o = self.opts
        reply = await self._reply(self.messages(expected, generated))
        label, issues = parse_verdict(reply, o.judge_equal_label, o.judge_not_equal_label)
        self.evaluations.append({"pass": kind, "verdict_label": label, "judgement_parsing_issues": issues,
                                 "response_tail": reply[-_TAIL:]})
        return o.judge_equal_label != o.judge_not_equal_label and label == o.judge_equal_label

    async def _reply(self, messages: Sequence[ChatMessage]) -> str:
        """One reply, retried with backoff (bounded); still failing: unscorable, so masked, never 0."""
        model, attempts = str(self.opts.judge_model), self.opts.judge_attempts
        for attempt in range(1, attempts + 1):
            try:
                reply = await asyncio.wait_for(self.chat(model, messages), self.opts.judge_timeout_s)
                if not isinstance(reply, str):
                    raise TypeError(f"judge reply is {type(reply).__name__}, not text")
                return reply
            except Exception as e:
                deterministic = isinstance(e, GymflowError) or getattr(e, "non_retryable", False)
                if attempt >= attempts or deterministic:
                    raise VerifierError(f"judge {model!r} failed after {attempt} attempt(s): {e!r}"[:500],
                                        failure_type=JUDGE_FAILED) from e
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
        raise AssertionError("unreachable")
