"""code_gen: answers scored as NeMo Gym scores them, and a replay of NeMo Gym's recorded rollouts."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pytest
from gymflow.environments.base import VerifyContext
from gymflow.environments.code_gen import CodeGenEnvironment, CodeGenTask, compare_output, extract_code
from gymflow.environments.sandbox import Limits, Sandbox, SandboxResult, SandboxStatus, SandboxUnavailable

from gymflow.data.datasets import load_jsonl
from gymflow.kernel.errors import TaskError, VerifierError
from gymflow.kernel.wire import ChatMessage, Score, Task
from tests.conftest import SHARED

DATA = SHARED / "code_gen"
CTX = VerifyContext(policy_model="test")
ADD = {"inputs": ["1 2\n", "5 7\n", "-3 3\n"], "outputs": ["3\n", "12\n", "0\n"]}
RIGHT = "Read two ints and add them:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\n"


@pytest.fixture(scope="module")
def env() -> CodeGenEnvironment:
    return CodeGenEnvironment(timeout_s=1.0)


def make_task(unit_tests: Mapping[str, Any] = ADD, **metadata: Any) -> Task:
    return Task(id="t0", env="code_gen", messages=(ChatMessage(role="user", content="Add two numbers."),),
                data={"verifier_metadata": {"unit_tests": dict(unit_tests), **metadata}})


async def score(env: CodeGenEnvironment, answer: str | None, task: Task | None = None, **extra: Any) -> Score:
    task = task or make_task()
    reply = ChatMessage(role="assistant", content=answer, **extra)
    return await env.verify(env.parse_task(task), (*task.messages, reply), {}, CTX)


def fenced(code: str) -> str:
    return f"Here you go.\n```python\n{code}\n```\n"


# ---- answers -----------------------------------------------------------------------------------


async def test_right_answer(env: CodeGenEnvironment) -> None:
    s = await score(env, RIGHT)
    assert s.reward == 1.0 and not s.masked
    assert s.details["result"] == [True, True, True] and s.details["num_tests"] == 3
    assert [t["status"] for t in s.details["tests"]] == ["ok"] * 3 and all(t["passed"] for t in s.details["tests"])
    assert "failure" not in s.details


async def test_wrong_answer_stops_at_the_first_failure(env: CodeGenEnvironment) -> None:
    s = await score(env, fenced("a, b = map(int, input().split())\nprint(a + b if a > 0 else 99)"))
    assert s.reward == 0.0
    assert s.details["result"] == [True, True, -2]
    assert s.details["failure"]["index"] == 2
    assert s.details["failure"]["error_message"] == "Wrong answer at output_line_idx=0: 99 != 0"
    first_wrong = await score(env, fenced("print(0)"))
    assert first_wrong.details["result"] == [-2] and len(first_wrong.details["tests"]) == 1


@pytest.mark.parametrize("answer,reason", [
    ("print(1 + 2)", "no fenced code block"),  # malformed: no fence at all
    ("```python\nprint(3)", "no fenced code block"),  # one fence line only
    ("", "empty answer"),
    ("  \n\t", "empty answer"),
    (None, "empty answer"),  # the model never answered in text
])
async def test_malformed_and_empty_answers_score_zero(env: CodeGenEnvironment, answer: str | None,
                                                      reason: str) -> None:
    s = await score(env, answer)
    assert s.reward == 0.0 and not s.masked
    assert s.details["reason"].startswith(reason)


async def test_whitespace_and_numbers_are_normalised(env: CodeGenEnvironment) -> None:
    task = make_task({"inputs": ["\n"], "outputs": ["1 2\n3.0\n0.5\n"]})
    padded = await score(env, fenced("print('  1 2   ')\nprint(3)\nprint(0.5000001)\nprint()\nprint()"), task)
    assert padded.reward == 1.0  # stripped lines; 3 == 3.0 as Decimals; float tokens within 1e-6
    split = await score(env, fenced("print('1')\nprint('2')\nprint(3)\nprint(0.5)"), task)
    assert split.details["failure"]["error_message"] == "Wrong answer: mismatched output length"
    far = await score(env, fenced("print('1 2')\nprint(3)\nprint(0.51)"), task)
    assert far.reward == 0.0


async def test_livecodebench_wrapping(env: CodeGenEnvironment) -> None:
    # The import prelude (gcd without an import), `if __name__ == '__main__'`, and exit() are all fine.
    code = "def main():\n    a, b = map(int, input().split())\n    print(gcd(a, b) * 0 + a + b)\n    exit(1)\n" \
           "\nif __name__ == '__main__':\n    main()"
    assert (await score(env, fenced(code))).reward == 1.0
    last_block = "```python\nprint('draft')\n```\nFixed:\n" + RIGHT
    assert (await score(env, last_block)).reward == 1.0


async def test_runtime_error_and_time_limit(env: CodeGenEnvironment) -> None:
    crash = await score(env, fenced("raise RuntimeError('nope')"))
    assert crash.details["result"] == [-4] and "RuntimeError: nope" in crash.details["failure"]["error"]
    slow = await score(env, fenced("while True:\n    pass"))
    assert slow.details["result"] == [-3] and slow.details["tests"][0]["status"] == "timeout"
    assert slow.details["failure"]["error_message"] == "Time Limit Exceeded"


async def test_think_tags_in_the_answer_score_the_penalty(env: CodeGenEnvironment) -> None:
    s = await score(env, "<think>hmm</think>\n" + RIGHT)
    assert s.reward == 0.0 and "reasoning format" in s.details["reason"]
    fine = await score(env, RIGHT, reasoning_content="<think>one block</think>")
    assert fine.reward == 1.0


# ---- failures that are not the model's -------------------------------------------------------


class BrokenSandbox(Sandbox):
    isolated = True

    def __init__(self, *, unavailable: bool) -> None:
        self.unavailable = unavailable

    async def check(self) -> None:
        if self.unavailable:
            raise SandboxUnavailable("bwrap: no user namespaces")

    async def run_python(self, source: str, stdin: bytes | str = b"", *, files: Mapping[str, bytes | str] | None = None,
                         limits: Limits | None = None) -> SandboxResult:
        return SandboxResult(SandboxStatus.ERROR, 1, "", "bwrap: setting up uid map: Permission denied", 0.01)

    def _stage(self, contents: Mapping[str, bytes | str]) -> Any:
        raise NotImplementedError

    def _argv(self, staged: Any, limits: Limits, ready_fd: int, info_fd: int) -> list[str]:
        raise NotImplementedError


@pytest.mark.parametrize("unavailable", [True, False])
async def test_sandbox_failure_is_a_verifier_error_not_a_zero(unavailable: bool) -> None:
    broken = CodeGenEnvironment(BrokenSandbox(unavailable=unavailable))
    with pytest.raises(VerifierError, match="bwrap"):
        await score(broken, RIGHT)


def test_bad_rows_are_task_errors(env: CodeGenEnvironment) -> None:
    bad = [
        ({"unit_tests": {"inputs": [], "outputs": []}}, "verifier_metadata.unit_tests.inputs"),
        ({"unit_tests": {"inputs": ["1"], "outputs": []}}, "1 inputs but 0 outputs"),
        ({"unit_tests": {"inputs": ["1"], "outputs": ["1"], "fn_name": "solve"}}, "call-based"),
        ({}, "verifier_metadata.unit_tests"),
    ]
    for metadata, message in bad:
        task = Task(id="t", env="code_gen", messages=(), data={"verifier_metadata": metadata})
        with pytest.raises(TaskError, match=message):
            env.parse_task(task)


def test_pure_helpers() -> None:
    assert extract_code("a\n```python\nx = 1\n```\nb\n```\ny = 2\n```") == "y = 2"
    assert extract_code("```\nonly one fence") == ""
    assert compare_output("1 2 \n\n", " 1 2") is None
    assert compare_output("1e0", "1.0000000001") is None
    assert compare_output("100000000000000001", "100000000000000000") is not None  # integers: exact
    assert compare_output("abc", "abd") == "Wrong answer at output_line_idx=0: abc != abd"


# ---- replay of NeMo Gym's recorded rollouts ----------------------------------------------------


def rollout_rows() -> list[dict[str, Any]]:
    with (DATA / "example_rollouts.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def output_text(response: Mapping[str, Any]) -> str:
    """What the Responses API calls `output_text`: the output_text parts of the message items, joined."""
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


@pytest.fixture(scope="module")
def tasks_by_prompt() -> dict[str, Task]:
    # The rollout rows carry no verifier_metadata: join them to example.jsonl by the prompt.
    tasks, errors = load_jsonl(DATA / "example.jsonl", env="code_gen")
    assert not errors
    return {t.messages[-1].content or "": t for t in tasks}


def test_example_rows_parse(env: CodeGenEnvironment, tasks_by_prompt: dict[str, Task]) -> None:
    parsed = [env.parse_task(t) for t in tasks_by_prompt.values()]
    assert len(parsed) == 5 and all(isinstance(p, CodeGenTask) for p in parsed)


@pytest.mark.parametrize("row", rollout_rows(), ids=lambda r: f"reward{r['reward']:.0f}-{len(r['result'])}tests")
async def test_replay_matches_recorded_reward(row: dict[str, Any], tasks_by_prompt: dict[str, Task]) -> None:
    env = CodeGenEnvironment()  # NeMo Gym's defaults: 10 s per test
    task = tasks_by_prompt[row["responses_create_params"]["input"][-1]["content"]]
    s = await score(env, output_text(row["response"]), task)
    assert s.reward == row["reward"]
    assert s.details["extracted_code"] == row["extracted_model_code"]
    assert s.details["result"] == row["result"]
    if "error_message" in row["metadata"]:
        assert s.details["failure"]["error_message"] == row["metadata"]["error_message"]
