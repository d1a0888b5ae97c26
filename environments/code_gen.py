"""The code generation environment (NeMo Gym's `code_gen`): stdin/stdout unit tests, LiveCodeBench grading.

Scoring follows NeMo Gym's `resources_servers/code_gen` (LiveCodeBench's `testing_util.grade_stdio`):
- The answer is the final assistant message's text. Empty -> 0. `<think>`/`</think>` in it (or more than
  one of either in its reasoning) -> `reasoning_format_penalty` (0.0), as NeMo Gym does.
- Code: the lines between the last two lines that contain a ``` fence, whatever the language tag
  (`extract_code(..., LMStyle.OpenAIChat)`). Fewer than two fence lines -> 0.
- The code is wrapped as LiveCodeBench does before it runs: a trailing `if __name__ == '__main__':`
  block is unwrapped, imports are hoisted, everything else becomes the body of `wrapped_function()`,
  behind LiveCodeBench's import prelude (`from math import *`, `import sys`, ... and
  `sys.setrecursionlimit(50000)`); `SystemExit` is swallowed; code containing `class Solution` is an error.
- Output: both sides `.strip()`ed, split on "\\n", each line `.strip()`ed. Line counts must agree; each
  line must match exactly, or token-wise as Decimals, with 1e-6 absolute/relative tolerance when a
  token looks like a float (NeMo Gym's current `decimal_tokens_match`; its Sept-2025 copy compared
  Decimals exactly. None of the example rows prints a float).
- Tests run in order and grading stops at the first failure; `details["result"]` is NeMo Gym's
  `result` list (True, or -2 wrong answer / -3 time limit / -4 runtime error). Reward 1 iff all pass.

Deliberate differences: each test runs as its own sandboxed process that reads the test input from
its real stdin and writes to its real stdout, like a judge. LiveCodeBench instead calls the function
in-process with `sys.stdin` replaced by a mock whose `readline()` drops the newline and whose
`readlines()` ends with an empty line, while fd 0 (`open(0)`, `from sys import stdin`, `os.read(0)`) is
empty, and with `sys.stdout` replaced by a StringIO (no `.buffer`). A program relying on those quirks
scores differently here. Limits: LiveCodeBench's 4 GB data limit is an address-space limit here; its
per-test 10 s alarm is a wall clock that includes interpreter start-up (+0.5 s slack).
"""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation

from gymflow.environments.base import JSON, Environment, TaskData, VerifyContext, final_assistant_text
from gymflow.environments.code_gen_testcases import UnitTests
from gymflow.environments.sandbox import Limits, Sandbox, SandboxResult, SandboxStatus, SandboxUnavailable, get_sandbox
from pydantic import BaseModel, ConfigDict

from gymflow.kernel.errors import VerifierError
from gymflow.kernel.failures import SANDBOX_UNAVAILABLE
from gymflow.kernel.wire import ChatMessage, Score

WRONG_ANSWER, TIME_LIMIT, RUNTIME_ERROR = -2, -3, -4
FLOAT_TOLERANCE = Decimal("1e-6")
_TRUNCATE = 300  # LiveCodeBench's truncatefn length for the metadata it reports
_CODE_KEEP = 20_000  # extracted code kept in details
# LiveCodeBench raises the stack limit to 4 GB for deep recursion. This is the main thread's; new threads
# get the sandbox's small `thread_stack_bytes`, so 64 of them fit under the address-space limit.
_STACK_BYTES = 512 << 20

# Runs inside the sandbox as main.py; the model's code is solution.py beside it. The wrapping is
# LiveCodeBench's `clean_if_name` + `make_function` + `compile_code`, done in the sandbox so that the
# host never parses untrusted code.
_HARNESS = r'''
import ast
import sys
import types

PRELUDE = (
    "from string import *\nfrom re import *\nfrom datetime import *\nfrom collections import *\n"
    "from heapq import *\nfrom bisect import *\nfrom copy import *\nfrom math import *\nfrom random import *\n"
    "from statistics import *\nfrom itertools import *\nfrom functools import *\nfrom operator import *\n"
    "from io import *\nfrom sys import *\nfrom json import *\nfrom builtins import *\nfrom typing import *\n"
    "import string\nimport re\nimport datetime\nimport collections\nimport heapq\nimport bisect\nimport copy\n"
    "import math\nimport random\nimport statistics\nimport itertools\nimport functools\nimport operator\n"
    "import io\nimport sys\nimport json\nsys.setrecursionlimit(50000)\n"
)


def clean_if_name(code):
    try:
        tree = ast.parse(code)
        last = tree.body[-1]
        if isinstance(last, ast.If) and ast.unparse(last.test).strip() == "__name__ == '__main__'":
            code = ast.unparse(tree.body[:-1]) + "\n" + ast.unparse(last.body)
    except Exception:
        pass
    return code


def make_function(code):
    try:
        tree = ast.parse(code)
        imports = [s for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom))]
        others = [s for s in tree.body if not isinstance(s, (ast.Import, ast.ImportFrom))]
        extra = {"type_params": []} if sys.version_info >= (3, 12) else {}
        fn = ast.FunctionDef(name="wrapped_function", args=ast.arguments(posonlyargs=[], args=[], kwonlyargs=[],
                             kw_defaults=[], defaults=[]), body=others, decorator_list=[], lineno=-1, **extra)
        return PRELUDE + "\n" + ast.unparse(imports) + "\n" + ast.unparse(fn)
    except Exception:
        return code


def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(50000)
    with open("solution.py", encoding="utf-8") as f:
        code = make_function(clean_if_name(f.read()))
    if "class Solution" in code:
        sys.stderr.write("Error during testing: a stdin/stdout solution defining class Solution\n")
        raise SystemExit(1)
    module = types.ModuleType("tmp_sol", "")
    exec(code, module.__dict__)
    try:
        module.wrapped_function()
    except SystemExit:
        pass
    sys.stdout.flush()


main()
'''


class VerifierMetadata(BaseModel):
    model_config = ConfigDict(frozen=True, extra="allow")

    unit_tests: UnitTests
    difficulty: str | None = None


class CodeGenTask(TaskData):
    verifier_metadata: VerifierMetadata


@dataclass(frozen=True)
class TestOutcome:
    index: int
    verdict: bool | int  # True, or a LiveCodeBench error code
    status: SandboxStatus
    exit_code: int | None
    wall_s: float
    failure: JSON | None = None  # LiveCodeBench-shaped metadata of a failed test

    @property
    def passed(self) -> bool:
        return self.verdict is True

    def summary(self) -> JSON:
        return {"index": self.index, "passed": self.passed, "status": str(self.status), "exit_code": self.exit_code,
                "wall_s": self.wall_s}


class CodeGenEnvironment(Environment[CodeGenTask]):
    """No gold solutions in NeMo Gym's rows, so `validate` returns None (the base class default)."""

    name = "code_gen"
    task_type = CodeGenTask
    needs = ("bubblewrap (`bwrap`) for its sandbox",)
    in_loop_reason = "its work is async I/O to bubblewrap sandboxes, which bound each program's time and memory"
    row_fields = ("hash_id", "dataset", "source", "metadata", "result", "extracted_model_code",
                  "extracted_model_output")  # NeMo Gym's task and rollout rows (routing, environments/base.py)

    def __init__(self, sandbox: Sandbox | None = None, *, timeout_s: float = 10.0, memory_bytes: int = 4 << 30,
                 max_concurrency: int | None = None, reasoning_format_penalty: float = 0.0) -> None:
        self._sandbox = sandbox  # resolved on first use: registering the environment must not need bwrap
        self.timeout_s = timeout_s  # NeMo Gym's unit_test_timeout_secs
        self.memory_bytes = memory_bytes  # LiveCodeBench's reliability_guard: 4 GB
        self.max_concurrency = max_concurrency or min(8, os.cpu_count() or 1)
        self.reasoning_format_penalty = reasoning_format_penalty
        self._slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    async def verify(self, data: CodeGenTask, messages: Sequence[ChatMessage], state: JSON,
                     ctx: VerifyContext) -> Score:
        tests = data.verifier_metadata.unit_tests
        base: JSON = {"num_tests": len(tests.inputs)}
        if data.verifier_metadata.difficulty is not None:
            base["difficulty"] = data.verifier_metadata.difficulty
        answer = final_assistant_text(messages)
        if not answer or not answer.strip():
            return Score(reward=0.0, details={**base, "reason": "empty answer"})
        if has_reasoning_format_violation(messages):
            return Score(reward=self.reasoning_format_penalty,
                         details={**base, "reason": "reasoning format violation: <think> tags in the answer"})
        code = extract_code(answer)
        if not code:
            return Score(reward=0.0, details={**base, "reason": "no fenced code block (``` ... ```) in the answer"})
        sandbox = await self._ready_sandbox()
        outcomes = await self._run_tests(sandbox, code, tests)
        return _score(base, code, outcomes, len(tests.inputs))

    async def _ready_sandbox(self) -> Sandbox:
        # No sandbox means no verdict: the rollout is masked, never scored 0.
        try:
            if self._sandbox is None:
                self._sandbox = get_sandbox()
            await self._sandbox.check()
        except SandboxUnavailable as err:
            raise VerifierError(f"code_gen cannot run code: {err}", failure_type=SANDBOX_UNAVAILABLE) from err
        return self._sandbox

    async def _run_tests(self, sandbox: Sandbox, code: str, tests: UnitTests) -> list[TestOutcome]:
        """Run tests concurrently (bounded) but judge them in order, cancelling the rest at the first failure."""
        slots = self._semaphore()

        async def one(i: int) -> TestOutcome:
            async with slots:
                return await self._run_test(sandbox, code, i, tests.inputs[i], tests.outputs[i])

        tasks = [asyncio.create_task(one(i)) for i in range(len(tests.inputs))]
        outcomes: list[TestOutcome] = []
        try:
            for task in tasks:
                outcomes.append(await task)
                if not outcomes[-1].passed:
                    break
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return outcomes

    async def _run_test(self, sandbox: Sandbox, code: str, index: int, stdin: str, expected: str) -> TestOutcome:
        try:
            result = await sandbox.run_python(_HARNESS, stdin, files={"solution.py": code},
                                              limits=self._limits(expected))
        except SandboxUnavailable as err:  # e.g. its cgroup could not be made: no verdict, so masked
            raise VerifierError(f"code_gen cannot run code: {err}", failure_type=SANDBOX_UNAVAILABLE) from err
        if result.status is SandboxStatus.ERROR:
            raise VerifierError(f"code_gen sandbox failed on test {index}: {result.stderr.strip()[-500:]}")
        verdict, failure = judge(result, stdin, expected)
        return TestOutcome(index, verdict, result.status, result.exit_code, result.wall_s, failure)

    def _limits(self, expected: str) -> Limits:
        # Output room: twice the expected answer plus 8 MiB; a longer output cannot be a right one in practice.
        return Limits(wall_s=self.timeout_s + 0.5, cpu_s=math.ceil(self.timeout_s) + 1, memory_bytes=self.memory_bytes,
                      stack_bytes=_STACK_BYTES, output_bytes=2 * len(expected.encode()) + (8 << 20), max_procs=128)

    def _semaphore(self) -> asyncio.Semaphore:
        # One per event loop: an asyncio.Semaphore binds to the loop that first waits on it.
        loop = asyncio.get_running_loop()
        if self._slots is None or self._slots[0] is not loop:
            self._slots = (loop, asyncio.Semaphore(self.max_concurrency))
        return self._slots[1]


# ---- pure parts: extraction, comparison, verdicts ------------------------------------------------


def extract_code(answer: str) -> str:
    """NeMo Gym's `extract_code(text, LMStyle.OpenAIChat)`: between the last two lines containing ```."""
    lines = answer.split("\n")
    fences = [i for i, line in enumerate(lines) if "```" in line]
    if len(fences) < 2:
        return ""
    return "\n".join(lines[fences[-2] + 1: fences[-1]])


def has_reasoning_format_violation(messages: Sequence[ChatMessage]) -> bool:
    """NeMo Gym's check: think tags in the final answer, or more than one of either in its reasoning."""
    last = next((m for m in reversed(messages) if m.role == "assistant"), None)
    if last is None:
        return False
    answer, reasoning = last.text or "", last.reasoning_content or ""
    if "<think>" in answer or "</think>" in answer:
        return True
    return reasoning.count("<think>") > 1 or reasoning.count("</think>") > 1


def compare_output(prediction: str, expected: str) -> str | None:
    """None when stdout matches as LiveCodeBench judges it; else its wrong-answer message."""
    got, want = _stripped_lines(prediction), _stripped_lines(expected)
    if len(got) != len(want):
        return "Wrong answer: mismatched output length"
    for idx, (g, w) in enumerate(zip(got, want, strict=True)):
        if g == w or _decimal_lines_match(w, g):
            continue
        return f"Wrong answer at output_line_idx={idx}: {truncate(g)} != {truncate(w)}"
    return None


def judge(result: SandboxResult, stdin: str, expected: str) -> tuple[bool | int, JSON | None]:
    """A test's verdict and, when it failed, LiveCodeBench-shaped metadata."""
    shown = {"inputs": truncate(stdin), "expected": truncate(expected)}
    if result.status is SandboxStatus.TIMEOUT:
        return TIME_LIMIT, {**shown, "error_code": TIME_LIMIT, "error_message": "Time Limit Exceeded"}
    if result.status is SandboxStatus.OUTPUT_LIMIT:
        return WRONG_ANSWER, {**shown, "output": truncate(result.stdout), "error_code": WRONG_ANSWER,
                              "error_message": "Wrong answer: output limit exceeded"}
    if result.status is not SandboxStatus.OK or result.exit_code != 0:
        return RUNTIME_ERROR, {**shown, "error_code": RUNTIME_ERROR, "error_message": "Runtime Error",
                               "error": truncate(result.stderr.strip(), 2000), "sandbox_status": str(result.status)}
    wrong = compare_output(result.stdout, expected)
    if wrong is None:
        return True, None
    return WRONG_ANSWER, {**shown, "output": truncate(result.stdout), "error_code": WRONG_ANSWER,
                          "error_message": wrong}


def truncate(s: str, length: int = _TRUNCATE) -> str:
    """LiveCodeBench's truncatefn."""
    if len(s) <= length:
        return s
    return s[: length // 2] + "...(truncated) ..." + s[-length // 2:]


def _score(base: JSON, code: str, outcomes: list[TestOutcome], total: int) -> Score:
    passed = len(outcomes) == total and all(o.passed for o in outcomes)
    details: JSON = {**base, "result": [o.verdict for o in outcomes], "tests": [o.summary() for o in outcomes],
                     "extracted_code": code[:_CODE_KEEP],
                     "unit_tests_time_s": round(sum(o.wall_s for o in outcomes), 4)}
    failure = next((o.failure for o in outcomes if o.failure is not None), None)
    if failure is not None:
        details["failure"] = {"index": outcomes[-1].index, **failure}
    return Score(reward=1.0 if passed else 0.0, details=details)


def _stripped_lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().split("\n")]


def _decimal_lines_match(expected: str, predicted: str) -> bool:
    want_tokens, got_tokens = expected.split(), predicted.split()
    try:
        want = [Decimal(t) for t in want_tokens]
        got = [Decimal(t) for t in got_tokens]
    except (InvalidOperation, ValueError):
        return False
    if len(want) != len(got):
        return False
    return all(_decimal_tokens_match(wt, gt, w, g) for wt, gt, w, g in zip(want_tokens, got_tokens, want, got,
                                                                           strict=True))


def _decimal_tokens_match(want_token: str, got_token: str, want: Decimal, got: Decimal) -> bool:
    try:
        if want == got:
            return True
    except InvalidOperation:  # signalling NaN
        return False
    if not (_looks_float(want_token) or _looks_float(got_token)):
        return False
    if not (want.is_finite() and got.is_finite()):
        return False
    error = abs(want - got)
    return error <= FLOAT_TOLERANCE or error / max(abs(want), Decimal(1)) <= FLOAT_TOLERANCE


def _looks_float(token: str) -> bool:
    return "." in token or "e" in token.lower()
