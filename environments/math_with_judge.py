"""Math with an LLM judge (NeMo Gym's `math_with_judge` resources server, as of NeMo Gym 0.7.0).

The answer is read across the whole episode, as NeMo Gym reads `response.output`: the text of every
assistant message after the prompt, joined with no separator (an agent may box its answer in one turn and
only confirm it in the last). With no complete, non-blank `\\boxed{}` in that text the reward is 0 and
nothing else runs. Otherwise math-verify compares the text with `expected_answer`; when that fails and a
judge is on, the judge is asked twice (answers swapped) whether the *boxed answer* and `expected_answer`
are equivalent, and the reward is 1 only if both verdicts say so.

Parity notes (NeMo Gym 0.7.0's app.py):
- the gold is `\\boxed{<expected_answer without outer \\( \\) or $ $>}`, parsed as LaTeX; the prediction is
  the whole episode text, parsed with (Expr, LaTeX) extraction, as NeMo Gym's `math_metric` does;
- the judge sees the raw `expected_answer` and only the last boxed answer's content (older NeMo Gym sent
  the whole answer: the recorded `judge_evaluations` of example_rollouts.jsonl show `\\boxed{...}`);
- the judge is skipped when the library check passes, and the swapped call is skipped when the first
  verdict is "different";
- a judge reply without a label counts as "different"; the first label in the text wins.
Deliberate differences: a judge that cannot be reached masks the rollout (`VerifierError`) instead of
scoring it; a math-verify check past its time limit (NeMo Gym's 10 s, `verify_timeout_s` here) or whose process
dies is masked, not scored 0 (under load a true answer timed out); the boxed answer is the last complete
top-level `\\boxed{}` (`\\boxed {x}` counts, escaped braces do not, and a truncated last box falls back
to the one before it), where NeMo Gym takes the last `\\boxed{` and scores 0 when that one is unterminated.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from typing import Any

from gymflow.environments.base import (
    MAX_VERIFY_S,
    MIN_CALL_S,
    PLATFORM_ERRORS,
    ChatFn,
    Environment,
    EnvironmentOptions,
    Placement,
    Step,
    TaskData,
    ToolOutput,
    VerifyContext,
    episode_assistant_texts,
    run_isolated,
)
from pydantic import Field

from gymflow.kernel.errors import GymflowError, ToolError, VerifierError
from gymflow.kernel.failures import JUDGE_FAILED, JUDGE_UNAVAILABLE
from gymflow.kernel.wire import ChatMessage, Score, Task, ToolSpec

JSON = dict[str, Any]


# NeMo Gym's judge messages (adapted there from Arena Hard); reproduced verbatim so verdicts compare.
JUDGE_SYSTEM_MESSAGE = """Please act as an impartial judge and evaluate the equivalence of the solutions given by two AI assistants to the mathematical problem displayed below. You will be given AI assistant A's answer and AI assistant B's answer. Your job is to evaluate whether assistant A's answer is equivalent to assistant B's answer.

Consider the mathematical equivalence of the AI assistants' answers above all other considerations. If the problem requests special formatting instructions, you may disregard any formatting considerations when evaluating the answers -- consider only mathematical equivalence.

After evaluating both answers for equivalence, you must output only one of the following choices as your final verdict with a label:

1.  The AI assistants' answers are equivalent: [[A=B]]
2.  The AI assistants' answers are different: [[A!=B]]

Example output: "My final verdict is different [[A!=B]]"."""  # noqa: E501

JUDGE_PROMPT_TEMPLATE = (
    "<|Problem|>\n{question}\n\n"
    "<|Start of Assistant A's Answer|>\n{first_answer}\n<|End of Assistant A's Answer|>\n\n"
    "<|Start of Assistant B's Answer|>\n{second_answer}\n<|End of Assistant B's Answer|>"
)
JUDGE_EQUAL_LABEL = "[[A=B]]"
JUDGE_NOT_EQUAL_LABEL = "[[A!=B]]"

_BOXED = re.compile(r"\\boxed\s*\{")
LOOP_SCAN_CHARS = 64 * 1024  # the most of a reply scanned for its box on the worker's loop
_JUDGE_TEXT_KEPT = 400  # tail of each judge reply kept in details (they travel in workflow history)


# ---- answer extraction ---------------------------------------------------------------------------


def _closing_brace(text: str, start: int) -> int | None:
    """Index of the `}` closing a group opened just before `start`; escaped `\\{` `\\}` do not count."""
    depth, i = 1, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last complete top-level `\\boxed{...}` in `text`, or None."""
    found, pos = None, 0
    while (m := _BOXED.search(text, pos)) is not None:
        end = _closing_brace(text, m.end())
        if end is None:  # unterminated (e.g. truncated output): nothing complete can follow
            break
        found, pos = text[m.end():end], end + 1
    return found


def strip_math_delimiters(s: str) -> str:
    """Drop outer `\\( \\)` or `$ $` from a gold answer, so `\\boxed{...}` around it still parses."""
    s = s.strip()
    if s.startswith("\\(") and s.endswith("\\)"):
        s = s[2:-2].strip()
    if s.startswith("$") and s.endswith("$") and len(s) > 1:
        s = s[1:-1].strip()
    return s


# ---- the library check (runs in a supervised process) ---------------------------------------------


def library_check(expected_answer: str, generated: str) -> tuple[float, str | None]:
    """math-verify verdict and extracted answer for the generated text, as NeMo Gym computes them.

    The line between a 0 and a mask: what the answer causes scores 0, as in NeMo Gym (nothing parses, nothing
    matches, or math-verify / SymPy raises over the answer's text). What is the platform's is never a 0: a check
    past its time limit or whose process dies or runs out of memory is masked by the supervised process that runs it
    (`verifier_timeout` / `verifier_crashed`), and an I/O or import failure here is a `VerifierError` (masked).

    math-verify's own timeouts are off: they use signal.alarm (main thread only) and turn a timeout into a silent
    False, i.e. a 0. The supervised process is killed at the verify limit instead.
    """
    from math_verify import parse, verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    try:
        gold = parse("\\boxed{" + strip_math_delimiters(expected_answer) + "}", (LatexExtractionConfig(),),
                     parsing_timeout=None)
        pred = parse(generated, (ExprExtractionConfig(), LatexExtractionConfig()), parsing_timeout=None)
        if not gold or not pred:
            return 0.0, None
        # The first extraction that matches is the answer (NeMo Gym's choice); stop there, SymPy is slow.
        match = next((p for p in pred if verify(gold, p, timeout_seconds=None)), None)
        return (0.0, str(pred[0])) if match is None else (1.0, str(match))
    except MemoryError:
        raise  # the process's memory cap: its supervisor masks the rollout and replaces the process
    except PLATFORM_ERRORS as e:
        raise VerifierError(f"math-verify could not run: {e!r}") from None
    except Exception:  # math-verify and SymPy raise all sorts over an answer; NeMo Gym scores these 0 too
        return 0.0, None


MARK_COMPLETE = "mark_task_complete"
COMPLETE_TOOL = ToolSpec(name=MARK_COMPLETE, description="Mark the task complete; your answer is then graded.",
                         parameters={"type": "object", "properties": {}})
CONFIRM_COMPLETE = ("Are you sure you want to mark the task as complete? Your answer will be graded and you won't "
                    "be able to change it. If so, call mark_task_complete again.")


# ---- the judge -----------------------------------------------------------------------------------


def judge_messages(question: str, first_answer: str, second_answer: str) -> list[ChatMessage]:
    prompt = JUDGE_PROMPT_TEMPLATE.format(question=question, first_answer=first_answer, second_answer=second_answer)
    return [ChatMessage(role="system", content=JUDGE_SYSTEM_MESSAGE), ChatMessage(role="user", content=prompt)]


def judge_verdict(text: str) -> str:
    """"equal", "different" or "no_label". The first label in the text wins, as in NeMo Gym."""
    eq, ne = text.find(JUDGE_EQUAL_LABEL), text.find(JUDGE_NOT_EQUAL_LABEL)
    if eq < 0 and ne < 0:
        return "no_label"
    return "equal" if eq >= 0 and (ne < 0 or eq < ne) else "different"


# ---- the environment -----------------------------------------------------------------------------


class MathWithJudgeTask(TaskData):
    question: str
    expected_answer: str
    # Per-task judge settings (NeMo Gym's names); the run's `VerifyContext.options` take precedence.
    should_use_judge: bool | None = None
    judge_model: str | None = None
    # Offer `mark_task_complete` (terminus-style agents end their episode with it; see `call_tool`).
    completion_tool: bool = False


def _option(ctx: VerifyContext, data: MathWithJudgeTask, key: str) -> Any:
    value = ctx.options.get(key)
    return value if value is not None else getattr(data, key)


class MathWithJudgeOptions(EnvironmentOptions):
    judge_model: str | None = Field(None, min_length=1, description="A configured model name: the judge")
    should_use_judge: bool | None = Field(None, description="NeMo Gym's flag; false: math-verify alone")
    library_timeout_s: float | None = Field(None, ge=MIN_CALL_S, le=MAX_VERIFY_S,
                                            description="Older name of verify_timeout_s")


class MathWithJudgeEnvironment(Environment[MathWithJudgeTask]):
    """Options (`VerifyContext.options`, else the task's fields): `judge_model`, the model name given to
    `ctx.chat`; `should_use_judge` (NeMo Gym's flag). Unset, the judge runs when both a judge model and
    `ctx.chat` are there."""

    name = "math_with_judge"
    task_type = MathWithJudgeTask
    Options = MathWithJudgeOptions
    needs = ("optional: a judge model (environments.math_with_judge.judge_model)",)
    placement = "local"  # math-verify in the workflow pool's supervised processes; a judge moves it to the env pool

    @classmethod
    def placement_for(cls, options: JSON) -> Placement:
        return "pool" if options.get("judge_model") or options.get("should_use_judge") else "local"

    def runs_in_loop(self, task: Task, options: JSON, step: Step) -> bool:
        """Verify with a judge runs in the worker's loop (the judge is an async model call, `ctx.chat`), its
        math-verify check still in a supervised process (`run_isolated`); all else runs in a supervised process."""
        if step != "verify":
            return False
        use = options.get("should_use_judge")
        use = task.data.get("should_use_judge") if use is None else use
        return use is not False and bool(use or options.get("judge_model") or task.data.get("judge_model"))

    def warm_up(self) -> None:
        import math_verify  # noqa: F401 - SymPy's import takes a second: before the first check's clock starts

        logging.getLogger("math_verify").setLevel(logging.CRITICAL)

    def tools(self, task: Task, data: MathWithJudgeTask) -> Sequence[ToolSpec]:
        return (*task.tools, COMPLETE_TOOL) if data.completion_tool else task.tools

    async def call_tool(self, data: MathWithJudgeTask, state: JSON, name: str, args: JSON) -> ToolOutput:
        """Terminus-style agents (NeMo Gym's terminus_2 harness) end their episode with `mark_task_complete`,
        called twice: the first call is answered with a request to confirm, the second ends the episode. So
        their recordings replay whole, with no hand splitting. Other tools (their `bash_command`) have no
        terminal here: the model is told so."""
        if name == MARK_COMPLETE:
            if state.get("completion_requested"):
                return ToolOutput(content="Task marked complete.", state=state, done=True)
            return ToolOutput(content=CONFIRM_COMPLETE, state={**state, "completion_requested": True})
        raise ToolError(f"unknown tool {name[:80]!r}: this environment runs no tools; answer in \\boxed{{}}")
    # What NeMo Gym's rollout rows add; routing must not take a joined replay row for another environment's.
    row_fields = ("extracted_answer", "library_reward", "judge_evaluations")

    def __init__(self, *, judge_attempts: int = 3, judge_backoff_s: float = 1.0) -> None:
        self.judge_attempts, self.judge_backoff_s = judge_attempts, judge_backoff_s

    async def verify(self, data: MathWithJudgeTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        text = "".join(episode_assistant_texts(messages))  # NeMo Gym joins the output texts with no separator
        # A scan in Python, linear but ~0.15 s a MB: with a judge this verify runs on the worker's loop, so a long
        # reply is scanned in a supervised process (a short one costs less than the hop).
        boxed = last_boxed(text) if len(text) <= LOOP_SCAN_CHARS else await run_isolated(ctx, last_boxed, text)
        details: JSON = {"expected_answer": data.expected_answer, "boxed_answer": boxed, "extracted_answer": None,
                         "library_reward": 0.0, "judge_evaluations": None}
        if boxed is None or not boxed.strip():  # NeMo Gym: no boxed answer, no library check and no judge
            return Score(reward=0.0, details=details)
        # Bounded by the verify limit (environments.math_with_judge.verify_timeout_s, or its older name
        # library_timeout_s): past it the rollout is masked, never 0 (see `library_check`).
        library_reward, extracted = await run_isolated(ctx, library_check, data.expected_answer, text)
        details.update(extracted_answer=extracted, library_reward=library_reward)
        if library_reward > 0.5:
            return Score(reward=library_reward, details=details)
        judge_model = self._judge_model(data, ctx)
        if judge_model is None:
            return Score(reward=library_reward, details=details)
        assert ctx.chat is not None  # _judge_model checked it
        reward, evaluations = await self._judge(ctx.chat, judge_model, data, boxed)
        return Score(reward=reward, details={**details, "judge_model": judge_model, "judge_evaluations": evaluations})

    async def validate(self, task: Task) -> Score:
        data = self.parse_task(task)
        gold = ChatMessage(role="assistant", content="\\boxed{" + data.expected_answer + "}")
        ctx = VerifyContext("", options={"should_use_judge": False})  # the gold must pass on the library alone
        return await self.verify(data, (*task.messages, gold), {}, ctx)

    def _judge_model(self, data: MathWithJudgeTask, ctx: VerifyContext) -> str | None:
        """The judge to ask, None when the judge is off. Asked for but unavailable: unscorable."""
        use, model = _option(ctx, data, "should_use_judge"), _option(ctx, data, "judge_model")
        if use is False:
            return None
        if model and ctx.chat is not None:
            return str(model)
        if use:
            raise VerifierError("should_use_judge is set but no judge model or chat function is configured",
                                failure_type=JUDGE_UNAVAILABLE)
        return None

    async def _judge(self, chat: ChatFn, model: str, data: MathWithJudgeTask, answer: str) -> tuple[float, list[JSON]]:
        """Both orders must say equal; positional bias is why NeMo Gym asks twice."""
        first = await self._judge_once(chat, model, "expected_first",
                                       judge_messages(data.question, data.expected_answer, answer))
        if first["verdict"] != "equal":
            return 0.0, [first]
        second = await self._judge_once(chat, model, "answer_first",
                                        judge_messages(data.question, answer, data.expected_answer))
        return (1.0 if second["verdict"] == "equal" else 0.0), [first, second]

    async def _judge_once(self, chat: ChatFn, model: str, order: str, messages: Sequence[ChatMessage]) -> JSON:
        reply = await self._ask(chat, model, messages)
        return {"order": order, "verdict": judge_verdict(reply), "response_tail": reply[-_JUDGE_TEXT_KEPT:]}

    async def _ask(self, chat: ChatFn, model: str, messages: Sequence[ChatMessage]) -> str:
        """One judge reply, retried with backoff; still failing means unscorable (masked), never 0."""
        for attempt in range(1, self.judge_attempts + 1):
            try:
                return await chat(model, messages)
            except Exception as e:
                # GymflowErrors and Temporal's non-retryable ApplicationErrors are deterministic: retrying won't help.
                deterministic = isinstance(e, GymflowError) or getattr(e, "non_retryable", False)
                if attempt >= self.judge_attempts or deterministic:
                    raise VerifierError(f"judge {model!r} failed after {attempt} attempt(s): {e}",
                                        failure_type=JUDGE_FAILED) from e
                await asyncio.sleep(self.judge_backoff_s * 2 ** (attempt - 1))
        raise VerifierError(f"judge {model!r}: no attempts allowed", failure_type=JUDGE_FAILED)
