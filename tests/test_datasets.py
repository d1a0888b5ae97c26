"""Dataset loading: NeMo Gym rows load unchanged; bad rows are reported by file, line and field."""

from __future__ import annotations

import json

from gymflow.kernel.datasets import load_jsonl
from tests.conftest import SHARED


def test_nemo_gym_rows_load_unchanged():
    for env_dir in ("example_single_tool_call", "math_with_judge", "code_gen", "calendar", "workplace_assistant"):
        tasks, errors = load_jsonl(SHARED / env_dir / "example.jsonl", env=env_dir)
        assert errors == [] and len(tasks) == 5, env_dir


def test_responses_format_converted_to_chat():
    tasks, _ = load_jsonl(SHARED / "example_single_tool_call" / "example.jsonl", env="single_tool")
    t = tasks[0]
    assert [m.role for m in t.messages] == ["system", "user"]  # developer -> system
    assert t.tools[0].to_openai()["function"]["name"] == "get_weather"
    assert t.id == "example-1"


def test_bad_rows_are_reported_and_good_rows_kept(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [
        json.dumps({"responses_create_params": {"input": "ok"}}),
        "{not json",
        json.dumps({"responses_create_params": {"input": [{"role": "wizard", "content": "x"}]}}),
        json.dumps({"responses_create_params": {"input": "x", "tools": [{"type": "function"}]}}),
        json.dumps({"id": "a/b", "responses_create_params": {"input": "x"}}),
        json.dumps({"something": 1}),
        "",
        json.dumps({"id": "z", "messages": [{"role": "user", "content": "hi"}]}),
    ]
    path.write_text("\n".join(rows))
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["d-1", "z"]
    got = [(e.line, e.message.split(":")[0]) for e in errors]
    assert got == [(2, "invalid JSON"), (3, "responses_create_params.input[0].role"),
                   (4, "responses_create_params.tools[0].name"), (5, "id"), (6, "responses_create_params")]
    assert str(errors[0]).startswith(f"{path}:2: ")


def test_rows_route_themselves_unless_an_env_is_given(tmp_path):
    path = tmp_path / "mixed.jsonl"
    path.write_text("\n".join([
        json.dumps({"env": "calendar", "responses_create_params": {"input": "a"}}),
        json.dumps({"env": "single_tool", "responses_create_params": {"input": "b"}}),
        json.dumps({"responses_create_params": {"input": "c"}}),
    ]))
    tasks, errors = load_jsonl(path, env=None)
    assert [t.env for t in tasks] == ["calendar", "single_tool"]
    assert [(e.line, e.message.split(":")[0]) for e in errors] == [(3, "env")]
    tasks, errors = load_jsonl(path, env="single_tool")
    assert errors == [] and {t.env for t in tasks} == {"single_tool"}
