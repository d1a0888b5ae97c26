"""Load JSONL datasets (NeMo Gym rows or chat rows) into wire `Task`s, reporting bad lines by file and line.

Every input is treated as hostile: a line is read with bounded memory and decoded on its own (one bad byte
costs one line, not the file), and a row must fit what the rest of the stack can carry (gymflow/kernel/
limits.py): Temporal's payload and id limits, Postgres' text rules (no NUL, no lone surrogates).
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from gymflow.data.routing import route_problem
from gymflow.kernel.errors import TaskError
from gymflow.kernel.limits import (
    MAX_ERROR_CHARS,
    MAX_JSON_DEPTH,
    MAX_REPORTED_ERRORS,
    MAX_ROW_BYTES,
    MAX_TASK_BYTES,
    MAX_TASK_ID_BYTES,
)
from gymflow.kernel.recorded_ids import NG_ROLLOUT_INDEX, default_task_id, recorded_sample
from gymflow.kernel.responses_format import input_to_messages, sampling_from, tool_to_spec, validation_message
from gymflow.kernel.wire import ChatMessage, Task

_NOT_VERIFIER_DATA = {"responses_create_params", "agent_ref", "messages", "tools", "max_turns"}
_BOM = b"\xef\xbb\xbf"
_BAD_TEXT = re.compile("[\x00\ud800-\udfff]")  # Postgres refuses NUL; a lone surrogate is not Unicode
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_JSONL_HINT = "JSONL has one JSON object per line; convert a JSON array with `jq -c '.[]'`"


def _printable(text: str) -> str:
    return _BAD_TEXT.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@dataclass(frozen=True)
class DatasetError:
    path: str
    line: int  # 0: the file as a whole
    message: str

    def __post_init__(self) -> None:
        # Messages quote row values, and errors are stored (runs.dataset_errors): one short line whatever the
        # row held, with no NUL or lone surrogate (a non-UTF-8 file name has those) for Postgres to refuse.
        text = " ".join(_printable(self.message).split())
        if len(text) > MAX_ERROR_CHARS:
            text = text[: MAX_ERROR_CHARS - 1] + "…"
        object.__setattr__(self, "message", text)
        object.__setattr__(self, "path", _printable(self.path))

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.line == 0 else f"{self.path}:{self.line}: {self.message}"


@dataclass
class ErrorLog:
    """Keeps the first `MAX_REPORTED_ERRORS` errors and counts the rest."""

    path: str
    limit: int = MAX_REPORTED_ERRORS
    count: int = 0
    bad_lines: int = 0  # errors about one line (the rest are about the whole file)
    _kept: list[DatasetError] = field(default_factory=list)

    def add(self, err: DatasetError) -> None:
        self.count += 1
        self.bad_lines += err.line > 0
        if len(self._kept) < self.limit:
            self._kept.append(err)

    @property
    def errors(self) -> list[DatasetError]:
        hidden = self.count - len(self._kept)
        more = [DatasetError(self.path, 0, f"{hidden} more bad lines not listed")] if hidden else []
        return self._kept + more


def grouped(errors: Iterable[DatasetError], show: int = 5) -> list[str]:
    """The errors to print, one line per distinct problem in a file: many rows with the same mistake are one
    `file: N rows: message (lines 1, 2, 3, …)`, not N copies. Errors about a whole file stay as they are."""
    lines: dict[tuple[str, str], list[int]] = {}
    order: list[DatasetError | tuple[str, str]] = []
    for err in errors:
        key = (err.path, err.message)
        if err.line == 0:
            order.append(err)
        elif key in lines:
            lines[key].append(err.line)
        else:
            lines[key] = [err.line]
            order.append(key)
    out = []
    for item in order:
        if isinstance(item, DatasetError):
            out.append(str(item))
            continue
        (path, message), found = item, lines[item]
        if len(found) == 1:
            out.append(f"{path}:{found[0]}: {message}")
            continue
        more = f", … ({len(found) - show} more)" if len(found) > show else ""
        out.append(f"{path}: {len(found)} rows: {message} (lines {', '.join(map(str, found[:show]))}{more})")
    return out


@dataclass(frozen=True)
class Row:
    line: int
    value: Any  # the parsed JSON, not yet checked


# ---- reading ------------------------------------------------------------------------------------------


def _physical_lines(f: IO[bytes]) -> Iterator[tuple[int, bytes | int]]:
    """(line number, its bytes without the line end), or (line number, its size) for a line over
    MAX_ROW_BYTES, which is skipped without being held in memory. Line ends are those of Python's text
    mode (\\n, \\r\\n, \\r), so default ids (`<stem>-<line>`) match every other reader of the file."""
    lineno = 0
    while chunk := f.readline(MAX_ROW_BYTES + 2):
        if not chunk.endswith(b"\n") and len(chunk) == MAX_ROW_BYTES + 2:
            size = len(chunk)
            while chunk and not chunk.endswith(b"\n"):
                chunk = f.readline(1 << 20)
                size += len(chunk)
            lineno += 1
            yield lineno, size - chunk.endswith(b"\n")
            continue
        body = chunk[:-1] if chunk.endswith(b"\n") else chunk
        parts = body.split(b"\r")
        if len(parts) > 1 and parts[-1] == b"" and chunk.endswith(b"\n"):
            parts.pop()  # \r\n is one line end
        for part in parts:
            lineno += 1
            yield lineno, part if len(part) <= MAX_ROW_BYTES else len(part)


def _file_hint(head: bytes) -> str | None:
    if head.startswith(b"\x1f\x8b"):
        return "the file is gzip-compressed; decompress it first"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "the file is UTF-16; save it as UTF-8"
    return None


def _parse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number (Postgres and most readers refuse it)")


def _decode(lineno: int, raw: bytes) -> tuple[str | None, str | None]:
    """(text, None) for a row to parse, (None, None) for a blank line, (None, error) otherwise."""
    if lineno == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]  # a UTF-8 byte-order mark (Windows editors) is harmless: drop it
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return None, f"not valid UTF-8: byte 0x{raw[e.start]:02x} at column {e.start + 1}"
    if not text.strip():
        return None, None
    if text.startswith("\ufeff"):
        return None, "the line starts with a byte-order mark (U+FEFF); only the file's first line may"
    return text, None


def _parse(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text, parse_constant=_parse_constant), None
    except json.JSONDecodeError as e:
        hint = f" ({_JSONL_HINT})" if text.lstrip().startswith("[") else ""
        return None, f"invalid JSON: {e.msg} at column {e.colno}{hint}"
    except RecursionError:
        return None, "invalid JSON: nested too deeply"
    except ValueError as e:  # NaN/Infinity, or an integer with thousands of digits
        return None, f"invalid JSON: {e}"


def read_rows(path: str | Path, errors: ErrorLog) -> Iterator[Row]:
    """Every non-blank line parsed as JSON; lines that are not (too big, not UTF-8, not JSON) go to `errors`."""
    p = Path(path)
    try:
        f = p.open("rb")
    except OSError as e:
        errors.add(DatasetError(str(p), 0, f"cannot read: {e.strerror or e}"))
        return
    rows = lines = 0
    with f:
        try:
            if hint := _file_hint(f.peek(4)[:4]):  # peek, not seek: the file may be a pipe
                errors.add(DatasetError(str(p), 0, hint))
                return
            for lineno, raw in _physical_lines(f):
                lines = lineno
                if isinstance(raw, int):
                    rows += 1
                    errors.add(DatasetError(str(p), lineno, f"row: {raw:,} bytes; at most {MAX_ROW_BYTES:,} "
                                                           "(Temporal carries each row in every rollout's input)"))
                    continue
                text, problem = _decode(lineno, raw)
                if text is not None:
                    value, problem = _parse(text)
                    if problem is None:
                        rows += 1
                        yield Row(lineno, value)
                        continue
                if problem:
                    errors.add(DatasetError(str(p), lineno, problem))
                    rows += 1
            if rows == 0:
                errors.add(DatasetError(str(p), 0, "no rows: the file is empty" if lines == 0 else
                                        "no rows: the file has only blank lines"))
        except OSError as e:  # e.g. a directory, or an I/O error midway
            errors.add(DatasetError(str(p), 0, f"read failed: {e.strerror or e}"))


# ---- checking one row ---------------------------------------------------------------------------------


def _key(key: str) -> str:
    return key if _PLAIN_KEY.fullmatch(key) else json.dumps(key[:40])


def _render(path: list[str | int]) -> str:
    out = ""
    if len(path) > 12:  # a nesting error's path is as deep as the nesting: show where it starts
        path = [*path[:12], "…"]
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += part if part == "…" else f".{_key(part)}" if out else _key(part)
    return out or "row"


def _text_problem(text: str) -> str | None:
    bad = _BAD_TEXT.search(text)
    if bad is None:
        return None
    if bad.group() == "\x00":
        return "contains a NUL character (\\u0000), which Postgres cannot store"
    return f"contains a lone surrogate (\\u{ord(bad.group()):04x}), which is not valid Unicode"


def _bad_value(value: Any, depth: int = 0) -> tuple[list[str | int], str] | None:
    """The first value no store or payload can carry, as (path, problem). Strings are checked in their
    container's loop (one call per object or array, not per value); recursion is bounded by the depth."""
    if isinstance(value, str):
        problem = _text_problem(value)
        return None if problem is None else ([], problem)
    if not isinstance(value, (dict, list)):
        return None
    if depth >= MAX_JSON_DEPTH:
        return [], f"nested deeper than {MAX_JSON_DEPTH} levels"
    for k, v in value.items() if isinstance(value, dict) else enumerate(value):
        if isinstance(k, str) and (problem := _text_problem(k)):
            return [k], f"key {problem}"
        if isinstance(v, str):
            if problem := _text_problem(v):
                return [k], problem
        elif isinstance(v, (dict, list)) and (found := _bad_value(v, depth + 1)):
            found[0].insert(0, k)
            return found
    return None


def check_value(value: Any) -> str | None:
    """`field.path: problem` for the first string that Postgres or a payload cannot carry, or for nesting
    past MAX_JSON_DEPTH; None when the whole value is fine."""
    bad = _bad_value(value)
    return None if bad is None else f"{_render(bad[0])}: {bad[1]}"


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    names = {dict: "an object", list: "an array", float: "a number", str: "a string", int: "an integer"}
    return names.get(type(value), type(value).__name__)


def _task_id(row: dict[str, Any], default_id: str) -> str:
    where = "id"
    if "id" not in row:
        raw: Any = default_id
        where = "id (the default one, from the file name and line)"
    else:
        raw = row["id"]
    if isinstance(raw, bool) or not isinstance(raw, (str, int)):
        raise TaskError(f"id: expected a string or an integer, got {_json_type(raw)}")
    task_id = str(raw)
    if not task_id.strip():
        raise TaskError(f"{where}: empty")
    size = len(task_id.encode("utf-8", "surrogatepass"))
    if size > MAX_TASK_ID_BYTES:
        raise TaskError(f"{where}: {size:,} bytes; at most {MAX_TASK_ID_BYTES} (it is part of the workflow id "
                        "<run>/<task>/<sample>)")
    if "/" in task_id:
        raise TaskError(f"{where}: {task_id!r} must not contain '/' (it is part of the workflow id)")
    for i, ch in enumerate(task_id):
        if unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp"):
            raise TaskError(f"{where}: control character U+{ord(ch):04X} at position {i + 1}")
    return task_id


def _prompt(row: dict[str, Any]) -> tuple[list[ChatMessage], Any, str, Any]:
    """(messages, raw tools, where the tools are, sampling) from either row format."""
    if "responses_create_params" in row:
        params = row["responses_create_params"]
        if not isinstance(params, dict):
            raise TaskError(f"responses_create_params: expected an object, got {_json_type(params)}")
        if "input" not in params:
            raise TaskError("responses_create_params.input: required")
        return (input_to_messages(params["input"]), params.get("tools") or [], "responses_create_params.tools",
                sampling_from(params))
    if "messages" in row:
        raw = row["messages"]
        if not isinstance(raw, list) or not raw:
            got = "an empty list" if isinstance(raw, list) else _json_type(raw)
            raise TaskError(f"messages: expected a non-empty list, got {got}")
        messages = []
        for i, m in enumerate(raw):
            try:
                messages.append(ChatMessage.model_validate(m))
            except ValidationError as e:
                raise TaskError(validation_message(e, f"messages[{i}]")) from None
        return messages, row.get("tools") or [], "tools", sampling_from({})
    raise TaskError("responses_create_params: required (or a chat `messages` list)")


def _max_turns(row: dict[str, Any]) -> int | None:
    """The row's own turn limit (absent or null: the run's applies alone)."""
    raw = row.get("max_turns")
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        got = repr(raw) if isinstance(raw, (int, float)) and not isinstance(raw, bool) else _json_type(raw)
        raise TaskError(f"max_turns: expected a positive integer, got {got}")
    return raw


def row_to_task(row: Any, *, env: str | None, default_id: str) -> Task:
    """`env` routes every row when given; otherwise each row names its own in an `env` field."""
    if not isinstance(row, dict):
        hint = f" ({_JSONL_HINT})" if isinstance(row, list) else ""
        raise TaskError(f"row: expected a JSON object, got {_json_type(row)}{hint}")
    if problem := check_value(row):
        raise TaskError(problem)
    task_id = _task_id(row, default_id)
    messages, raw_tools, where, sampling = _prompt(row)
    if not isinstance(raw_tools, list):
        raise TaskError(f"{where}: expected a list, got {_json_type(raw_tools)}")
    tools = [tool_to_spec(t, f"{where}[{i}]") for i, t in enumerate(raw_tools)]
    row_env = env or row.get("env")
    if not isinstance(row_env, str) or not row_env:
        raise TaskError("env: required (route the row with an `env` field, or choose one with --env)")
    data = {k: v for k, v in row.items() if k not in _NOT_VERIFIER_DATA}
    max_turns = _max_turns(row)
    try:
        task = Task(id=task_id, env=row_env, messages=tuple(messages), tools=tuple(tools), sampling=sampling,
                    data=data, max_turns=max_turns)
    except ValidationError as e:
        raise TaskError(validation_message(e, "row")) from None
    size = len(task.model_dump_json())
    if size > MAX_TASK_BYTES:
        raise TaskError(f"row: {size:,} bytes as a task; at most {MAX_TASK_BYTES:,} (Temporal carries it in every "
                        "rollout's input)")
    return task


# ---- whole files --------------------------------------------------------------------------------------


def iter_tasks(path: str | Path, *, env: str | None, errors: ErrorLog) -> Iterator[tuple[Row, Task]]:
    """Each row that makes a `Task`, with its line; the others go to `errors`. Duplicates are not checked."""
    p = Path(path)
    for row in read_rows(p, errors):
        try:
            yield row, row_to_task(row.value, env=env, default_id=default_task_id(p.stem, row.line, row.value))
        except TaskError as e:
            errors.add(DatasetError(str(p), row.line, str(e)))


def duplicate(seen: dict[str, int], task_id: str, line: int) -> str | None:
    """The error for a task id an earlier line already used; records the id otherwise."""
    if task_id in seen:
        return f"id: {task_id!r} repeats line {seen[task_id]}"
    seen[task_id] = line
    return None


def load_jsonl(path: str | Path, *, env: str | None, samples: dict[str, int] | None = None
               ) -> tuple[list[Task], list[DatasetError]]:
    """Parse every line; bad lines become `DatasetError`s (file, line, field) and the rest still load.

    Rows of one task id that carry distinct sample indices (a NeMo Gym rollout file with several samples per task)
    are one task, its recorded samples, not duplicates; `samples`, when given, gets each such task's count."""
    errors = ErrorLog(str(path))
    tasks: list[Task] = []
    seen: dict[str, int] = {}
    recorded: dict[str, dict[int, int]] = {}  # task id -> recorded sample index -> its line
    first: dict[str, Task] = {}
    for row, task in iter_tasks(path, env=env, errors=errors):
        sample = recorded_sample(row.value)
        if task.id in recorded and sample is not None:  # a further sample of a task already loaded
            if problem := _sample_problem(first[task.id], task, sample, recorded[task.id], seen[task.id]):
                errors.add(DatasetError(str(path), row.line, problem))
            else:
                recorded[task.id][sample] = row.line
            continue
        problem = duplicate(seen, task.id, row.line)
        if problem is None and env:  # a row another environment fits better (its own checks run in the rollout)
            problem = route_problem(env, task, check_target=False, row=row.value)
        if problem:
            errors.add(DatasetError(str(path), row.line, problem))
        else:
            tasks.append(task)
            if sample is not None:
                recorded[task.id], first[task.id] = {sample: row.line}, task
    if samples is not None:
        samples.update({task_id: len(lines) for task_id, lines in recorded.items()})
    return tasks, errors.errors


def _sample_problem(first: Task, task: Task, sample: int, lines: dict[int, int], first_line: int) -> str | None:
    if sample in lines:
        return f"{NG_ROLLOUT_INDEX}: sample {sample} of task {task.id!r} repeats line {lines[sample]}"
    if (task.env, task.messages, task.tools) != (first.env, first.messages, first.tools):
        return (f"id: {task.id!r}: sample {sample}'s prompt differs from line {first_line}'s (the samples of one "
                "task share its prompt and tools)")
    return None
