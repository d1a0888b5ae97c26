"""Routing: a row is checked against the environment it is sent to, and a row that another environment fits
better gets an error naming that environment; a raw NeMo Gym rollouts file is told to go through `data join`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from click.testing import CliRunner
from gymflow.environments.base import Environment, TaskData
from gymflow.environments.registry import available

from gymflow.cli.data_cmd import data
from gymflow.data import routing
from gymflow.data.datasets import load_jsonl, row_to_task
from gymflow.data.prepare import prepare
from gymflow.kernel.wire import Score
from tests.conftest import SHARED

FIXTURES = Path(__file__).parent / "data" / "nemo_gym"
# Each environment's own NeMo Gym example rows: they must route to it silently.
OWN_ROWS = {
    "single_tool": SHARED / "example_single_tool_call" / "example.jsonl",
    "math_with_judge": SHARED / "math_with_judge" / "example.jsonl",
    "code_gen": SHARED / "code_gen" / "example.jsonl",
    "calendar": SHARED / "calendar" / "example.jsonl",
    "workplace_assistant": SHARED / "workplace_assistant" / "example.jsonl",
    "reasoning_gym": FIXTURES / "reasoning_gym" / "example.jsonl",
    "xlam_fc": FIXTURES / "xlam_fc" / "example.jsonl",
    "mcqa": FIXTURES / "mcqa" / "example.jsonl",
    "equivalence_llm_judge": FIXTURES / "equivalence_llm_judge" / "example_openqa.jsonl",
    "instruction_following": FIXTURES / "instruction_following" / "example.jsonl",
}


def installed(*names: str) -> None:
    missing = [n for n in names if n not in available()]
    if missing:
        pytest.skip(f"environment(s) not installed: {', '.join(missing)}")


@pytest.mark.parametrize("env", sorted(OWN_ROWS))
def test_own_rows_route_silently(env: str) -> None:
    installed(env)
    tasks, errors = load_jsonl(OWN_ROWS[env], env=env)
    assert not errors and tasks
    assert [routing.route_problem(env, t) for t in tasks] == [None] * len(tasks)


@pytest.mark.parametrize(("rows", "sent_to", "belongs_to", "field"), [
    ("xlam_fc", "single_tool", "xlam_fc", "expected_answers"),  # single_tool accepts anything: only routing catches it
    ("equivalence_llm_judge", "math_with_judge", "equivalence_llm_judge", "uuid"),
    ("mcqa", "equivalence_llm_judge", "mcqa", "grading_mode"),
    ("reasoning_gym", "math_with_judge", "reasoning_gym", "answer"),
    ("instruction_following", "single_tool", "instruction_following", "instruction_id_list"),
    ("math_with_judge", "single_tool", "math_with_judge", "expected_answer"),
    ("calendar", "workplace_assistant", "calendar", "exp_cal_state"),
])
def test_misrouted_rows_name_their_environment(rows: str, sent_to: str, belongs_to: str, field: str) -> None:
    installed(sent_to, belongs_to)
    tasks, errors = load_jsonl(OWN_ROWS[rows], env=sent_to)
    assert not tasks and len(errors) == len(OWN_ROWS[rows].read_text().splitlines())
    for err in errors:
        assert re.search(rf"looks like a (`\w+` or )*`{belongs_to}`( or `\w+`)* row", err.message), err.message
        assert field in err.message and f"--env {belongs_to}" in err.message


def test_prepare_reports_the_target_error_and_the_better_environment(tmp_path: Path) -> None:
    installed("equivalence_llm_judge")
    report = prepare(OWN_ROWS["equivalence_llm_judge"], "math_with_judge", tmp_path / "out.jsonl")
    assert report.written == 0 and report.errors
    first = str(report.errors[0])
    assert first.startswith(f"{OWN_ROWS['equivalence_llm_judge']}:1: question: Field required")
    assert "--env equivalence_llm_judge" in first


def test_prepare_on_raw_rollouts_says_join_first(tmp_path: Path) -> None:
    rollouts = SHARED / "math_with_judge" / "example_rollouts.jsonl"
    result = CliRunner().invoke(data, ["prepare", str(rollouts), "--env", "math_with_judge",
                                       "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code == 1
    output = " ".join(result.output.split())  # rich wraps long lines
    # one line for the five rows with the same mistake
    assert output.count("gymflow data join") == 1 and "5 rows: question: Field required" in output
    # once joined, the same rows prepare cleanly
    joined = tmp_path / "joined.jsonl"
    CliRunner().invoke(data, ["join", str(rollouts), "--tasks", str(SHARED / "math_with_judge" / "example.jsonl"),
                              "--out", str(joined)])
    assert prepare(joined, "math_with_judge", tmp_path / "p.jsonl").written == 5


def test_rows_that_fit_both_equally_are_not_flagged() -> None:
    """`question` + `expected_answer` is a math_with_judge row and an equivalence_llm_judge row alike."""
    installed("equivalence_llm_judge")
    tasks, errors = load_jsonl(SHARED / "math_with_judge" / "example.jsonl", env="equivalence_llm_judge")
    assert not errors and len(tasks) == 5


def test_unknown_target_and_generic_fields_are_left_alone() -> None:
    task = row_to_task({"messages": [{"role": "user", "content": "hi"}], "_ng_task_index": 3, "agent_ref": {}},
                       env="no_such_env", default_id="x")
    assert routing.route_problem("no_such_env", task) is None
    assert routing.route_problem("single_tool", task.model_copy(update={"env": "single_tool"})) is None


def test_clean_rows_import_no_other_environment() -> None:
    """Routing a clean file imports the target only; a misrouted row loads the others (once)."""
    code = ("import sys; from gymflow.data.datasets import load_jsonl\n"
            f"t, e = load_jsonl({str(OWN_ROWS['math_with_judge'])!r}, env='math_with_judge')\n"
            "assert len(t) == 5 and not e\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m.startswith('gymflow.environments.') and m != 'gymflow.environments.base'))\n"
            f"t, e = load_jsonl({str(OWN_ROWS['calendar'])!r}, env='math_with_judge')\n"
            "print('gymflow.environments.reasoning_gym_env' in sys.modules, len(e))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    first, second = out.stdout.strip().splitlines()
    assert first == "['gymflow.environments.math_with_judge', 'gymflow.environments.registry']"
    assert second == "True 5"


# ---- the mechanism, on made-up environments --------------------------------------------------------------


class _Plain(Environment[TaskData]):
    name = "plain"
    task_type = TaskData

    async def verify(self, *args: Any) -> Score:
        return Score(reward=0.0)


class _GuessTask(TaskData):
    secret: str


class _Guess(_Plain):
    name = "guess"
    task_type = _GuessTask
    row_fields: ClassVar[tuple[str, ...]] = ("hint",)


@pytest.fixture
def fake_envs(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    envs = {"plain": _Plain(), "guess": _Guess()}
    for fn in (routing._environment, routing._installed, routing._known, routing._rivals):
        fn.cache_clear()
    monkeypatch.setattr(routing, "_environment", envs.get)
    monkeypatch.setattr(routing, "_installed", lambda: tuple(envs))
    yield
    for fn in (routing._known, routing._rivals):
        fn.cache_clear()


def task(**data: Any):
    return row_to_task({"messages": [{"role": "user", "content": "q"}], **data}, env="plain", default_id="t")


@pytest.mark.usefixtures("fake_envs")
def test_declared_row_fields_count() -> None:
    assert routing.route_problem("plain", task(secret="s")) is not None  # the task type's field
    assert "has hint, secret" in (routing.route_problem("plain", task(secret="s", hint="h")) or "")
    assert routing.route_problem("plain", task(hint="h")) is None  # `guess` would refuse it: nothing better
    assert routing.route_problem("guess", task(secret="s", other=1)) is None
    rejected = routing.route_problem("guess", task(hint="h"))
    assert rejected is not None and rejected.startswith("secret: Field required") and "looks like" not in rejected


@pytest.mark.usefixtures("fake_envs")
def test_hostile_rows_do_not_break_routing() -> None:
    row = {f"k{i}": "\x01" * 10 for i in range(500)}
    assert routing.route_problem("plain", task(**row)) is None
    assert routing.route_problem("plain", task(secret={"deep": [1] * 1000}, **row)) is None  # guess refuses it


def test_rollout_rows_are_detected() -> None:
    row = json.loads((SHARED / "math_with_judge" / "example_rollouts.jsonl").read_text().splitlines()[0])
    assert routing.is_rollout_row(row_to_task(row, env="math_with_judge", default_id="r"))
    assert not routing.is_rollout_row(row_to_task({**row, "response": "text"}, env="math_with_judge", default_id="r"))


def _qa_row(agent: str | None) -> dict[str, Any]:
    row: dict[str, Any] = {"responses_create_params": {"input": [{"role": "user", "content": "What is 2+2?"}]},
                           "question": "What is 2+2?", "expected_answer": "4"}
    if agent:
        row["agent_ref"] = {"type": "responses_api_agents", "name": agent}
    return row


def test_agent_ref_tells_apart_rows_whose_fields_two_environments_share(tmp_path):
    # question + expected_answer fit math_with_judge and equivalence_llm_judge alike; NeMo Gym's agent_ref does not.
    installed("math_with_judge", "equivalence_llm_judge")
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in (
        _qa_row("equivalence_llm_judge_simple_agent"), _qa_row("math_with_judge_simple_agent"), _qa_row(None),
        _qa_row("some_other_agent"))) + "\n")
    tasks, errors = load_jsonl(path, env="math_with_judge")
    assert [e.line for e in errors] == [1]
    assert "`equivalence_llm_judge` row" in errors[0].message and "--env equivalence_llm_judge" in errors[0].message
    assert len(tasks) == 3
    report = prepare(path, "math_with_judge", tmp_path / "out.jsonl")
    assert report.written == 3
    assert routing.agent_environment(_qa_row("example_single_tool_call_simple_agent")) == "single_tool"
    assert routing.agent_environment({"agent_ref": {"name": 7}}) is None
