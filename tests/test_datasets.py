"""Dataset loading: NeMo Gym rows load unchanged; bad rows are reported by file, line and field."""

from __future__ import annotations

import json

import pytest

from gymflow.data.datasets import load_jsonl
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


# ---- hostile input: each case once broke a command (traceback, hang, or a whole run aborted) ----------


def _row(task_id: object = None, text: str = "hi", **extra: object) -> dict:
    row: dict = {"responses_create_params": {"input": text}, **extra}
    if task_id is not None:
        row["id"] = task_id
    return row


def _write(path, lines: list[bytes]) -> None:
    path.write_bytes(b"\n".join(lines) + b"\n")


def test_invalid_utf8_costs_one_line(tmp_path):
    path = tmp_path / "d.jsonl"
    _write(path, [json.dumps(_row("a")).encode(), b'{"id": "b", "responses_create_params": {"input": "\xff"}}',
                  json.dumps(_row("c")).encode()])
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["a", "c"]
    assert [str(e) for e in errors] == [f"{path}:2: not valid UTF-8: byte 0xff at column 51"]


def test_oversized_row_is_skipped_without_reading_it_whole(tmp_path):
    from gymflow.kernel.limits import MAX_ROW_BYTES

    path = tmp_path / "d.jsonl"
    huge = json.dumps(_row("big", "x" * (3 * MAX_ROW_BYTES))).encode()
    _write(path, [huge, json.dumps(_row("ok")).encode()])
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["ok"]
    assert [(e.line, e.message.split(";")[0]) for e in errors] == [(1, f"row: {len(huge):,} bytes")]


def test_the_row_limit_is_exact(tmp_path):
    from gymflow.kernel.limits import MAX_ROW_BYTES

    path = tmp_path / "d.jsonl"

    def sized(task_id: str, size: int) -> bytes:
        empty = b'{"id": "%s", "responses_create_params": {"input": ""}}' % task_id.encode()
        return empty[:-3] + b"x" * (size - len(empty)) + empty[-3:]

    at_limit, over = sized("at", MAX_ROW_BYTES), sized("over", MAX_ROW_BYTES + 1)
    path.write_bytes(at_limit + b"\r\n" + over + b"\n" + over)  # with and without a line end
    assert len(at_limit) == MAX_ROW_BYTES and len(over) == MAX_ROW_BYTES + 1
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["at"]
    assert [(e.line, e.message.split(";")[0]) for e in errors] == [
        (2, f"row: {MAX_ROW_BYTES + 1:,} bytes"), (3, f"row: {MAX_ROW_BYTES + 1:,} bytes")]


def test_a_task_too_large_for_temporal_is_refused_even_when_its_row_is_small(tmp_path):
    # Chat messages grow when they become wire messages (every field is spelled out).
    messages = [{"role": "user", "content": "x"}] * 30_000
    path = tmp_path / "d.jsonl"
    _write(path, [json.dumps({"id": "m", "messages": messages}).encode()])
    tasks, errors = load_jsonl(path, env="e")
    assert tasks == [] and errors[0].message.startswith("row: ") and "as a task" in errors[0].message


@pytest.mark.parametrize(("task_id", "message"), [
    ("d" * 2000, "id: 2,000 bytes; at most 200"),
    ("é" * 101, "id: 202 bytes; at most 200"),  # bytes, not characters: the workflow id limit is in bytes
    ("a\u0000b", "id: contains a NUL character"),
    ("a\tb", "id: control character U+0009 at position 2"),
    ("a\u2028b", "id: control character U+2028"),
    ("a\ud800", "id: contains a lone surrogate"),
    ("", "id: empty"),
    (None, "id: expected a string or an integer, got null"),
    ([1], "id: expected a string or an integer, got an array"),
    ({"a": 1}, "id: expected a string or an integer, got an object"),
    (True, "id: expected a string or an integer, got a boolean"),
    (1.5, "id: expected a string or an integer, got a number"),
])
def test_bad_ids_are_refused(tmp_path, task_id, message):
    path = tmp_path / "d.jsonl"
    row = {"id": task_id, "responses_create_params": {"input": "hi"}}
    _write(path, [json.dumps(row).encode(), json.dumps(_row(7)).encode()])
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["7"]  # an integer id is fine, as its string
    assert len(errors) == 1 and errors[0].line == 1 and errors[0].message.startswith(message), errors


def test_nul_and_surrogates_anywhere_name_the_field(tmp_path):
    path = tmp_path / "d.jsonl"
    rows = [
        {"id": "a", "responses_create_params": {"input": [{"role": "user", "content": "x\u0000"}]}},
        _row("b", extra={"deep": [{"k": "\ud83d"}]}),
        _row("c", **{"we\u0000ird": 1}),
        _row("ok"),
    ]
    _write(path, [json.dumps(r).encode() for r in rows])
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["ok"]
    assert [(e.line, e.message.split(":")[0]) for e in errors] == [
        (1, "responses_create_params.input[0].content"), (2, "extra.deep[0].k"), (3, '"we\\u0000ird"')]


@pytest.mark.parametrize(("line", "message"), [
    (b"[1, 2]", "row: expected a JSON object, got an array (JSONL has one JSON object per line"),
    (b"[", "invalid JSON: Expecting value at column 2 (JSONL has one JSON object per line"),
    (b"42", "row: expected a JSON object, got an integer"),
    (b'{"id": NaN, "responses_create_params": {"input": "x"}}', "invalid JSON: NaN is not a JSON number"),
    (b'{"id": 1' + b"0" * 5000 + b"}", "invalid JSON: Exceeds the limit"),
    (b"[" * 100_000, "invalid JSON: nested too deeply"),
    (json.dumps(_row("n", x=json.loads("[" * 70 + "]" * 70))).encode(), "x[0][0]"),
    (b"\xef\xbb\xbf" + json.dumps(_row("bom")).encode(), "the line starts with a byte-order mark"),
    (json.dumps({"id": "t", "responses_create_params": {"input": [{"type": "function_call"}]}}).encode(),
     "responses_create_params.input[0].name: required"),
    (json.dumps({"id": "s", "responses_create_params": {"input": "x", "temperature": "hot"}}).encode(),
     "responses_create_params.temperature:"),
    (json.dumps({"id": "f", "responses_create_params": {"input": "x", "tools": [{"function": 5}]}}).encode(),
     "responses_create_params.tools[0].function: expected an object"),
    (json.dumps({"id": "r", "responses_create_params": {"input": [{"role": ["user"]}]}}).encode(),
     "responses_create_params.input[0].role: unknown role"),
    (json.dumps({"id": "m", "messages": []}).encode(), "messages: expected a non-empty list"),
    (json.dumps({"id": "m", "messages": [{"role": "user", "content": 5}]}).encode(), "messages[0].content:"),
])
def test_malformed_lines_are_reported_not_raised(tmp_path, line, message):
    path = tmp_path / "d.jsonl"
    _write(path, [json.dumps(_row("first")).encode(), line])
    tasks, errors = load_jsonl(path, env="e")
    assert [t.id for t in tasks] == ["first"]
    assert len(errors) == 1 and errors[0].line == 2 and message in errors[0].message, errors


@pytest.mark.parametrize(("content", "message"), [
    (b"", "no rows: the file is empty"),
    (b"\n   \n\t\n", "no rows: the file has only blank lines"),
    (b"\x1f\x8b\x08\x00rest", "the file is gzip-compressed"),
    (b"\xff\xfe{\x00", "the file is UTF-16"),
])
def test_files_with_no_rows_say_why(tmp_path, content, message):
    path = tmp_path / "d.jsonl"
    path.write_bytes(content)
    tasks, errors = load_jsonl(path, env="e")
    assert tasks == [] and [str(e) for e in errors] == [f"{path}: {message}" + ("; decompress it first" if
                                                        "gzip" in message else "; save it as UTF-8" if
                                                        "UTF-16" in message else "")]


def test_bom_and_crlf_are_fine_and_line_numbers_match_text_mode(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + b"\r\n".join(json.dumps(_row()).encode() for _ in range(3)) + b"\r\n")
    tasks, errors = load_jsonl(path, env="e")
    assert errors == [] and [t.id for t in tasks] == ["d-1", "d-2", "d-3"]


def test_error_list_and_messages_stay_bounded(tmp_path):
    from gymflow.kernel.limits import MAX_ERROR_CHARS, MAX_REPORTED_ERRORS

    path = tmp_path / "d.jsonl"
    path.write_bytes(b"{oops\n" * (MAX_REPORTED_ERRORS + 5) + json.dumps({"id": "[/x]" + "y" * 5000}).encode())
    _, errors = load_jsonl(path, env="e")
    assert len(errors) == MAX_REPORTED_ERRORS + 1
    assert str(errors[-1]) == f"{path}: 6 more bad lines not listed"
    assert all(len(e.message) <= MAX_ERROR_CHARS for e in errors)
