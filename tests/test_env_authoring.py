"""The environment authoring kit: `gymflow env new` writes a package whose own tests pass, and `gymflow env check`
plays each row through the real tool and verify paths, reporting by line."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
from click.testing import CliRunner
from gymflow.environments.base import JSON, Environment, TaskData, ToolOutput, VerifyContext, final_assistant_text

from gymflow.authoring.checker import CheckFailed, check_task
from gymflow.authoring.schema_args import example_value
from gymflow.cli.env_cmd import env as env_group
from gymflow.data.datasets import row_to_task
from gymflow.kernel.errors import VerifierError
from gymflow.kernel.wire import ChatMessage, FunctionCall, Score, Task, ToolCall, ToolSpec
from tests.conftest import SHARED


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(env_group, list(args))
    return result.exit_code, result.output


# ---- env new -------------------------------------------------------------------------------------------


def test_env_new_writes_a_package_whose_generated_tests_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out = _run("new", "demo_adder", "--dir", str(tmp_path))
    assert code == 0, out
    pkg = tmp_path / "demo_adder"
    meta = tomllib.loads((pkg / "pyproject.toml").read_text())
    target = meta["project"]["entry-points"]["gymflow.environments"]["demo_adder"]
    assert meta["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [target.split(".")[0]]
    # The entry point resolves, from the package's folder, to an Environment named like the entry point.
    monkeypatch.syspath_prepend(str(pkg))
    cls = EntryPoint("demo_adder", target, "gymflow.environments").load()
    assert issubclass(cls, Environment) and cls.name == "demo_adder"

    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(tmp_path / "bt")], cwd=pkg, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4 passed" in proc.stdout


@pytest.mark.parametrize(("name", "problem"), [
    ("1adder", "lowercase Python identifier"),
    ("My_env", "lowercase Python identifier"),
    ("my-env", "lowercase Python identifier"),
    ("class", "lowercase Python identifier"),
    ("single_tool", "already installed"),
])
def test_env_new_refuses_bad_names(tmp_path: Path, name: str, problem: str) -> None:
    code, out = _run("new", name, "--dir", str(tmp_path))
    assert code != 0 and problem in out and repr(name) in out
    assert not any(tmp_path.iterdir())


def test_env_new_refuses_an_existing_folder(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    code, out = _run("new", "taken", "--dir", str(tmp_path))
    assert code != 0 and "already exists" in out
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["keep.txt"]


# ---- env check on data ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("env_name", "folder"), [("single_tool", "example_single_tool_call"),
                                                   ("math_with_judge", "math_with_judge")])
def test_env_check_passes_the_nemo_gym_examples(env_name: str, folder: str) -> None:
    path = SHARED / folder / "example.jsonl"
    code, out = _run("check", env_name, str(path))
    assert code == 0, out
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    for line in range(1, len(rows) + 1):
        assert f"{path}:{line}: ok: validate 1;" in out
    assert f"{len(rows)} lines: {len(rows)} ok, 0 failed" in out


def test_env_check_reports_broken_lines_and_fails(tmp_path: Path) -> None:
    good = [line for line in (SHARED / "math_with_judge" / "example.jsonl").read_text().splitlines() if line.strip()]
    missing = json.loads(good[3])
    del missing["expected_answer"]
    data = tmp_path / "broken.jsonl"
    data.write_text("\n".join([good[0], good[1], '{"responses_create_params": ', json.dumps(missing), good[4]]) + "\n")
    code, out = _run("check", "math_with_judge", str(data))
    assert code == 1, out
    assert f"{data}:3: error: invalid JSON" in out
    assert f"{data}:4: error: expected_answer: Field required" in out
    for line in (1, 2, 5):
        assert f"{data}:{line}: ok" in out
    assert "5 lines: 3 ok, 2 failed" in out


def test_env_check_names_an_unknown_environment(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text('{"responses_create_params": {"input": "hi"}}\n')
    code, out = _run("check", "no_such_env", str(data))
    assert code != 0 and "unknown environment 'no_such_env'" in out


# ---- the checker's findings on faulty environments -----------------------------------------------------


class _Task(TaskData):
    answer: str


TOOL = ToolSpec(name="lookup", parameters={"type": "object", "required": ["key", "n"], "properties": {
    "key": {"type": "string", "minLength": 3}, "n": {"type": "integer", "minimum": 2},
    "mode": {"enum": ["fast", "slow"]}, "tags": {"type": "array", "items": {"type": "string"}}}})


class _Env(Environment[_Task]):
    """Correct unless a test flips one of its faults."""

    name = "faulty_demo"
    task_type = _Task
    gold_reward, tool_crash, hostile_crash, masked, gold = 1.0, False, False, False, False

    def tools(self, task: Task, data: _Task) -> Sequence[ToolSpec]:
        return (TOOL,)

    async def call_tool(self, data: _Task, state: JSON, name: str, args: JSON) -> ToolOutput:
        if self.tool_crash:
            raise KeyError("boom")
        return ToolOutput(content=json.dumps(args), state={"args": args})

    async def verify(self, data: _Task, messages: Sequence[ChatMessage], state: JSON, ctx: VerifyContext) -> Score:
        text = final_assistant_text(messages) or ""
        if self.masked:
            raise VerifierError("judge down")
        if self.hostile_crash and "\x00" in text:
            raise ValueError("NUL in answer")
        return Score(reward=1.0 if text == data.answer else 0.0)

    def gold_turns(self, task: Task, data: _Task) -> Sequence[ChatMessage] | None:
        if not self.gold:
            return None
        call = ToolCall(id="g", function=FunctionCall(name="lookup", arguments='{"key": "abc", "n": 2}'))
        return (ChatMessage(role="assistant", tool_calls=(call,)),
                ChatMessage(role="assistant", content=data.answer if self.gold_reward else "wrong"))

    async def validate(self, task: Task) -> Score:
        return Score(reward=self.gold_reward)


def _check(env: _Env) -> str:
    task = row_to_task({"messages": [{"role": "user", "content": "q"}], "answer": "42"}, env=env.name,
                       default_id="t-1")
    return asyncio.run(check_task(env, task, timeout_s=10))


def test_checker_passes_a_correct_environment_and_plays_its_gold() -> None:
    env = _Env()
    assert "scripted episode (1 tools called) reward 0" in _check(env)
    env.gold = True
    assert "gold episode reward 1" in _check(env)


@pytest.mark.parametrize(("fault", "value", "finding"), [
    ("gold_reward", 0.0, "validate: the gold answer scored 0, not 1"),
    ("tool_crash", True, "tool 'lookup': crashed: KeyError"),
    ("hostile_crash", True, "verify (hostile reply): crashed: ValueError: NUL in answer"),
    ("masked", True, "verify: masked (verifier_failed): judge down"),
])
def test_checker_reports_each_fault(fault: str, value: object, finding: str) -> None:
    env = _Env()
    setattr(env, fault, value)
    with pytest.raises(CheckFailed) as err:
        _check(env)
    assert finding in str(err.value)


def test_a_gold_episode_that_does_not_win_fails() -> None:
    env = _Env()
    env.gold = True

    async def validate(task: Task) -> Score:  # validate passes; only the episode's answer is wrong
        return Score(reward=1.0)

    env.gold_reward = 0.0
    env.validate = validate  # type: ignore[method-assign]
    with pytest.raises(CheckFailed, match="gold episode scored 0, not 1"):
        _check(env)


def test_schema_arguments_meet_the_schema() -> None:
    args = example_value(TOOL.parameters)
    assert isinstance(args["key"], str) and len(args["key"]) >= 3
    assert isinstance(args["n"], int) and args["n"] >= 2
    assert args["mode"] == "fast" and args["tags"] == ["example"]
    assert example_value({"type": ["null", "number"]}) == 1.0
    recursive: JSON = {"type": "object", "properties": {}}
    recursive["properties"]["self"] = recursive
    assert isinstance(example_value(recursive), dict)  # bounded depth, no RecursionError
