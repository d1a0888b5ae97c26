"""Fuzz every door a dataset comes in by: files mixing good rows with every kind of bad line we know of
(invalid JSON or UTF-8, NUL bytes, lone surrogates, oversized rows, bad or duplicate ids, wrong types,
non-objects, missing fields, NaN, deep nesting, a stray byte-order mark), with blank lines, CRLF and a
leading BOM thrown in. Whatever the mix: every bad line is reported by its line number, every good row gets
through (written by `data prepare`, collected once by `collect`), nothing raises, nothing is left running.
"""

from __future__ import annotations

import io
import json
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from click.testing import CliRunner
from hypothesis import HealthCheck, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from rich.console import Console

from gymflow.cli.collect_cmd import collect_dataset
from gymflow.cli.data_cmd import data
from gymflow.data.prepare import prepare
from gymflow.kernel.limits import MAX_JSON_DEPTH, MAX_ROW_BYTES, MAX_TASK_ID_BYTES

ENV = "single_tool"  # takes any prompt and needs no verifier fields
STEM = "data"
RESERVED = {"id", "env", "responses_create_params", "messages", "tools", "agent_ref", "max_turns"}  # fields read

text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), max_size=30)
id_text = st.text(st.characters(exclude_categories=("Cc", "Cs", "Zl", "Zp"), exclude_characters="/"), max_size=20)
keys = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1, max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=12,
)


@dataclass
class Dataset:
    lines: list[bytes] = field(default_factory=list)
    good: dict[int, tuple[str, dict[str, Any]]] = field(default_factory=dict)  # line -> (task id, row)
    bad: dict[int, str] = field(default_factory=dict)  # line -> which kind of bad, for failure messages
    explicit_ids: list[str] = field(default_factory=list)

    def content(self, crlf: bool, bom: bool) -> bytes:
        body = (b"\r\n" if crlf else b"\n").join(self.lines) + b"\n"
        return b"\xef\xbb\xbf" + body if bom else body


@st.composite
def good_row(draw: st.DrawFn, index: int) -> tuple[str | None, dict[str, Any]]:
    """A valid row for ENV: explicit string or integer id, or none (the default `<stem>-<line>`)."""
    id_kind = draw(st.sampled_from(["str", "int", "none"]))
    task_id: Any = {"str": f"{index}-{draw(id_text)}", "int": 100_000 + index, "none": None}[id_kind]
    if draw(st.booleans()):
        role_items = st.fixed_dictionaries({"role": st.sampled_from(["developer", "system", "user", "assistant"]),
                                            "content": text})
        prompt = draw(text | st.lists(role_items, min_size=1, max_size=3))
        row: dict[str, Any] = {"responses_create_params": {"input": prompt}}
    else:
        messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "user"]), "content": text}),
                            min_size=1, max_size=3)
        row = {"messages": draw(messages)}
    row.update(draw(st.dictionaries(keys.filter(lambda k: k not in RESERVED), json_values, max_size=3)))
    if task_id is not None:
        row = {"id": task_id, **row}
    return (None if task_id is None else str(task_id)), row


def _dumps(row: Any, ascii_only: bool = True) -> bytes:
    return json.dumps(row, ensure_ascii=ascii_only).encode()


def _prompt(row: dict[str, Any], value: str) -> dict[str, Any]:
    return {**{k: v for k, v in row.items() if k != "messages"}, "responses_create_params": {"input": value}}


@st.composite
def bad_line(draw: st.DrawFn, row: dict[str, Any], ds: Dataset) -> tuple[str, bytes]:
    """A line that must be refused, made by breaking a good row one way."""
    kind = draw(st.sampled_from(["json", "utf8", "nul", "surrogate", "huge", "id", "types", "non_object",
                                 "missing", "dup", "nan", "deep", "bom"]))
    if kind == "dup" and ds.explicit_ids:
        return kind, _dumps({**row, "id": draw(st.sampled_from(ds.explicit_ids))})
    if kind == "bom" and ds.lines:  # only the file's first line may start with a byte-order mark
        return kind, b"\xef\xbb\xbf" + _dumps(row)
    if kind == "utf8":
        raw, junk = _dumps(row, ascii_only=draw(st.booleans())), draw(st.sampled_from(
            [b"\xff", b"\xfe", b"\xc0\xaf", b"\xed\xa0\x80"]))
        at = draw(st.integers(0, len(raw)))
        return kind, raw[:at] + junk + raw[at:]
    if kind in ("nul", "surrogate"):
        bad = "\x00" if kind == "nul" else draw(st.sampled_from(["\ud800", "\udfff", "\udc80"]))
        where = draw(st.sampled_from(["id", "prompt", "value", "key"]))
        broken = {"id": {**row, "id": f"x{bad}"}, "prompt": _prompt(row, f"a{bad}b"),
                  "value": {**row, "extra": [{"v": bad}]}, "key": {**row, f"k{bad}": 1}}[where]
        return f"{kind} in {where}", _dumps(broken)
    if kind == "huge":
        return kind, _dumps(_prompt(row, "x" * draw(st.integers(MAX_ROW_BYTES + 1, 3 * MAX_ROW_BYTES))))
    if kind == "id":
        bad_id = draw(st.sampled_from([None, [1], {"a": 1}, True, 1.5, "", " ", "a/b", "[/x]", "é" * 101,
                                       "a\tb", "a\u2028b", "a\x7fb"])
                      | st.text(min_size=MAX_TASK_ID_BYTES + 1, max_size=2000))
        return f"id {bad_id!r:.40}", _dumps({**row, "id": bad_id})
    if kind == "types":
        broken = draw(st.sampled_from([
            {"responses_create_params": 5}, {"responses_create_params": []},
            {"responses_create_params": {"input": 5}}, {"responses_create_params": {"input": []}},
            {"responses_create_params": {"input": [5]}}, {"responses_create_params": {"input": [{"role": "wizard"}]}},
            {"responses_create_params": {"input": "q", "tools": "x"}},
            {"responses_create_params": {"input": "q", "tools": [{"type": "web_search"}]}},
            {"responses_create_params": {"input": "q", "temperature": "hot"}},
            {"responses_create_params": {"input": [{"type": "function_call", "arguments": "{}"}]}},
            {"messages": "hello"}, {"messages": []}, {"messages": [{"role": "user", "content": 5}]},
        ]))
        base = {k: v for k, v in row.items() if k not in ("responses_create_params", "messages")}
        return f"types {broken}", _dumps({**base, **broken})
    if kind == "non_object":
        return kind, draw(st.sampled_from([b"[1, 2]", b"5", b'"row"', b"null", b"true", b"[", b"]"]))
    if kind == "missing":
        return kind, _dumps({k: v for k, v in row.items() if k not in ("responses_create_params", "messages")})
    if kind == "nan":
        return kind, _dumps(row)[:-1] + b', "score": NaN}'
    if kind == "deep":
        nested: Any = 1
        for _ in range(draw(st.integers(MAX_JSON_DEPTH + 1, MAX_JSON_DEPTH + 20))):
            nested = [nested]
        return kind, _dumps({**row, "nested": nested})
    garbage = draw(st.sampled_from([b"{oops", b"{'single': 1}", b'{"a": 1,}', b'"unterminated', b"nul"]))
    return "json", garbage if draw(st.booleans()) else _dumps(row)[:-1]


@st.composite
def datasets(draw: st.DrawFn, max_lines: int) -> Dataset:
    ds = Dataset()
    for index in range(draw(st.integers(1, max_lines))):
        lineno = len(ds.lines) + 1
        kind = draw(st.sampled_from(["good", "good", "bad", "blank"]))
        task_id, row = draw(good_row(index))
        if kind == "blank":
            ds.lines.append(draw(st.sampled_from([b"", b"   ", b"\t"])))
        elif kind == "good":
            ds.lines.append(_dumps(row, ascii_only=draw(st.booleans())))
            ds.good[lineno] = (task_id or f"{STEM}-{lineno}", row)
            if task_id is not None:
                ds.explicit_ids.append(task_id)
        else:
            why, line = draw(bad_line(row, ds))
            ds.lines.append(line)
            ds.bad[lineno] = why
    return ds


def write(folder: str, ds: Dataset, crlf: bool, bom: bool) -> Path:
    path = Path(folder) / f"{STEM}.jsonl"
    path.write_bytes(ds.content(crlf, bom))
    return path


def check_errors(path: Path, errors: list[Any], ds: Dataset) -> None:
    if not ds.good and not ds.bad:
        assert [str(e) for e in errors] == [f"{path}: no rows: the file has only blank lines"]
        return
    reported = {e.line: str(e) for e in errors}
    for line, why in ds.bad.items():
        assert line in reported, f"bad line {line} ({why}) not reported; got {sorted(reported)}"
        assert reported[line].startswith(f"{path}:{line}: ")
    assert set(reported) == set(ds.bad), f"good lines reported as bad: {set(reported) - set(ds.bad)}"


# ---- layer 1: `data prepare`, in process, many examples -------------------------------------------------


@hsettings(max_examples=150, deadline=None, database=None)
@given(ds=datasets(max_lines=12), crlf=st.booleans(), bom=st.booleans())
def test_prepare_reports_every_bad_line_and_writes_every_good_row(ds: Dataset, crlf: bool, bom: bool):
    with tempfile.TemporaryDirectory() as folder:
        path, out = write(folder, ds, crlf, bom), Path(folder) / "out.jsonl"
        before = path.read_bytes()
        report = prepare(path, ENV, out)
        check_errors(path, report.errors, ds)
        written = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
        assert written == [{**row, "env": ENV} for _, row in ds.good.values()]
        assert (report.written, report.invalid) == (len(ds.good), len(ds.bad))

        result = CliRunner().invoke(data, ["prepare", str(path), "--env", ENV, "--out", str(out)],
                                    env={"COLUMNS": "1000"})
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        assert result.exit_code == (1 if ds.bad or not ds.good else 0), result.output
        # Rows with the same mistake are one line (`path: N rows: why (lines 1, 2, …)`): every bad row counted once.
        singles = {int(n) for n in re.findall(rf"{re.escape(str(path))}:(\d+): ", result.output)}
        groups = re.findall(rf"{re.escape(str(path))}: (\d+) rows: .*?\(lines ([\d, ]+)", result.output)
        listed = singles | {int(n) for _, lines in groups for n in lines.split(", ")}
        assert listed <= set(ds.bad), result.output
        assert len(singles) + sum(int(n) for n, _ in groups) == len(ds.bad), result.output
        assert path.read_bytes() == before  # the input is never touched


# ---- layer 2: `collect` on the real stack, few examples ---------------------------------------------------


@hsettings(max_examples=8, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ds=datasets(max_lines=6), crlf=st.booleans(), bom=st.booleans())
async def test_collect_runs_every_good_row_once_and_reports_every_bad_line(gf, settings, sql, ds: Dataset,
                                                                         crlf: bool, bom: bool):
    run_id = "fz-" + uuid.uuid4().hex[:10]
    output = io.StringIO()
    with tempfile.TemporaryDirectory() as folder:
        path = write(folder, ds, crlf, bom)
        try:
            await collect_dataset(settings, str(path), env=ENV, model="policy", n=1, run_id=run_id,
                                  console=Console(file=output, width=1000))
        except click.ClickException as e:
            assert not ds.good and "no valid rows" in e.message, e.message
        printed = output.getvalue()
        # Rows with the same mistake are one line (`path: N rows: why (lines 1, 3)`), as `data prepare` prints them.
        grouped = {int(n) for _, lines in re.findall(rf"{re.escape(str(path))}: (\d+) rows: .*?\(lines ([\d, ]+)",
                                                     printed) for n in lines.split(", ")}
        for line, why in ds.bad.items():
            assert f"{path}:{line}: " in printed or line in grouped, f"bad line {line} ({why}) not reported:\n{printed}"
    rows = sql("SELECT task_id, status FROM rollouts WHERE run_id = %s", run_id)
    assert sorted(task_id for task_id, _ in rows) == sorted(task_id for task_id, _ in ds.good.values())
    assert all(status == "completed" for _, status in rows), rows
